/* fsdpctl synth: a small learnable task as a token cache, so a tiny model's loss visibly
 * falls without any external dataset.
 *
 * Task: copy a random string.  Each record is
 *     BOS x1 .. xk SEP x1 .. xk EOS
 * with k drawn per record and symbols from a small alphabet; the prompt (BOS .. SEP) is
 * masked out of the loss, the copy and EOS are targets.  A model first learns the alphabet
 * (loss falls from ln(vocab) towards ln(alphabet)), then learns to copy (towards 0). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/fsdpctl.h"
#include "proto/rng.h"
#include "proto/tokens.h"

enum { SYNTH_BOS = 1, SYNTH_EOS = 2, SYNTH_SEP = 3, SYNTH_FIRST_SYMBOL = 10 };

typedef struct synth_options {
    const char *out;
    long records, seq_len, vocab, alphabet, seed;
} synth_options;

/* Record r's random string length and symbols come from its own stream, so the file is a
 * pure function of the options. */
static int synth_record(tok_writer *w, const synth_options *o, uint64_t r, int32_t *tokens,
                        uint8_t *mask, errbuf *err) {
    uint64_t stream = rng_stream(RNG_PURPOSE_SYNTH, r);
    long k_max = (o->seq_len - 3) / 2, k_min = k_max < 4 ? 1 : 4;
    long k = k_min + (long)(rng_u64((uint64_t)o->seed, stream, 0) % (uint64_t)(k_max - k_min + 1));
    int n = 0;
    tokens[n] = SYNTH_BOS, mask[n++] = 0;
    for (long i = 0; i < k; i++) {
        uint64_t s = rng_u64((uint64_t)o->seed, stream, 1 + (uint64_t)i) % (uint64_t)o->alphabet;
        tokens[n] = SYNTH_FIRST_SYMBOL + (int32_t)s, mask[n++] = 0;
    }
    tokens[n] = SYNTH_SEP, mask[n++] = 0;
    for (long i = 0; i < k; i++) tokens[n] = tokens[1 + i], mask[n++] = 1;
    tokens[n] = SYNTH_EOS, mask[n++] = 1;
    return tok_writer_add(w, tokens, mask, (uint64_t)n, err);
}

static int synth_usage(void) {
    fprintf(stderr, "usage: fsdpctl synth --out FILE [--records N] [--seq-len T] [--vocab V]"
                    " [--alphabet A] [--seed S]\n");
    return 2;
}

static int parse_long(const char *s, long min, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < min) return -1;
    *out = v;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    synth_options o = {NULL, 4096, 64, 32000, 32, 1};
    static const struct option longopts[] = {
        {"out", required_argument, 0, 'o'},      {"records", required_argument, 0, 'n'},
        {"seq-len", required_argument, 0, 't'},  {"vocab", required_argument, 0, 'v'},
        {"alphabet", required_argument, 0, 'a'}, {"seed", required_argument, 0, 's'},
        {0, 0, 0, 0}};
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        long *dst = opt == 'n' ? &o.records : opt == 't' ? &o.seq_len : opt == 'v' ? &o.vocab
                  : opt == 'a' ? &o.alphabet : opt == 's' ? &o.seed : NULL;
        if (opt == '?') ctl_flag_error("synth", argv);
        if (opt == 'o') o.out = optarg;
        else if (!dst || parse_long(optarg, opt == 's' ? 0 : 1, dst) != 0) return synth_usage();
    }
    if (!o.out || optind != argc) return synth_usage();
    if (o.seq_len < 5) {
        fprintf(stderr, "fsdpctl synth: --seq-len %ld is too short (at least 5)\n", o.seq_len);
        return 2;
    }
    if (o.vocab < SYNTH_FIRST_SYMBOL + o.alphabet || o.vocab > INT32_MAX) {
        fprintf(stderr, "fsdpctl synth: --vocab %ld cannot hold %d special ids and %ld symbols\n",
                o.vocab, SYNTH_FIRST_SYMBOL, o.alphabet);
        return 2;
    }
    int32_t *tokens = malloc((size_t)o.seq_len * sizeof *tokens);
    uint8_t *mask = malloc((size_t)o.seq_len);
    tok_writer w;
    tok_writer_init(&w, (uint32_t)o.vocab);
    errbuf err;
    int rc = (tokens && mask) ? 0 : errf(&err, "out of memory");
    for (long r = 0; rc == 0 && r < o.records; r++) rc = synth_record(&w, &o, (uint64_t)r, tokens, mask, &err);
    if (rc == 0) rc = tok_writer_save(&w, o.out, &err);
    if (rc == 0)
        printf("wrote %s: %ld records, %llu tokens (copy task, alphabet %ld, seq_len %ld)\n", o.out,
               o.records, (unsigned long long)w.n_tokens, o.alphabet, o.seq_len);
    else
        fprintf(stderr, "fsdpctl synth: %s\n", err.msg);
    tok_writer_free(&w);
    free(tokens);
    free(mask);
    return rc == 0 ? 0 : 1;
}
