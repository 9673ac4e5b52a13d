/* fsdpctl tokenize: data into a token cache (proto/tokens.h).
 *
 * --from-safetensors FILE: a batch file (proto/batch.h, the golden references' form) whose
 * rows become records, one a row, in order: every input id is a token, and a label either
 * repeats its row's input id (a training target, mask 1) or is -100 (context, mask 0).  A
 * cache keeps a loss mask, not free labels, so any other label is refused. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/fsdpctl.h"
#include "proto/batch.h"
#include "proto/tokens.h"

enum { IGNORE_INDEX = -100 };

static int tokenize_usage(void) {
    fprintf(stderr, "usage: fsdpctl tokenize --from-safetensors FILE --out CACHE [--vocab V]\n"
                    "  (FILE holds input_ids and labels [N, T]; one record a row)\n");
    return 2;
}

/* Row r as a record: its tokens and the mask its labels give. */
static int add_row(tok_writer *w, const batch_file *b, int r, uint8_t *mask, const char *path,
                   errbuf *err) {
    const int32_t *ids = b->input_ids + (size_t)r * b->T, *labels = b->labels + (size_t)r * b->T;
    for (int t = 0; t < b->T; t++) {
        if (ids[t] < 0)
            return errf(err, "%s: input_ids[%d][%d] = %d is negative", path, r, t, ids[t]);
        if (labels[t] != ids[t] && labels[t] != IGNORE_INDEX)
            return errf(err, "%s: labels[%d][%d] = %d is neither the input id %d nor -100 "
                        "(a token cache keeps a loss mask, not free labels)",
                        path, r, t, labels[t], ids[t]);
        mask[t] = labels[t] != IGNORE_INDEX;
    }
    return tok_writer_add(w, ids, mask, (uint64_t)b->T, err);
}

static int tokenize_batch_file(const char *path, const char *out, long vocab, errbuf *err) {
    batch_file b;
    if (batch_read(&b, path, err)) return -1;
    int32_t max_id = 0;
    for (size_t i = 0; i < (size_t)b.B * b.T; i++)
        if (b.input_ids[i] > max_id) max_id = b.input_ids[i];
    int rc = 0;
    if (vocab == 0) vocab = (long)max_id + 1;
    else if (max_id >= vocab)
        rc = errf(err, "%s: input id %d does not fit --vocab %ld", path, max_id, vocab);
    uint8_t *mask = malloc((size_t)b.T);
    if (rc == 0 && !mask) rc = errf(err, "out of memory");
    tok_writer w;
    tok_writer_init(&w, (uint32_t)vocab);
    for (int r = 0; rc == 0 && r < b.B; r++) rc = add_row(&w, &b, r, mask, path, err);
    if (rc == 0) rc = tok_writer_save(&w, out, err);
    if (rc == 0)
        printf("wrote %s: %d records of %d tokens from %s (vocab %ld)\n", out, b.B, b.T, path,
               vocab);
    tok_writer_free(&w);
    free(mask);
    batch_free(&b);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *from = NULL, *out = NULL;
    long vocab = 0;
    static const struct option longopts[] = {{"from-safetensors", required_argument, 0, 'f'},
                                             {"out", required_argument, 0, 'o'},
                                             {"vocab", required_argument, 0, 'v'},
                                             {0, 0, 0, 0}};
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end;
        if (opt == 'f') from = optarg;
        else if (opt == 'o') out = optarg;
        else if (opt == 'v' && (vocab = strtol(optarg, &end, 10)) >= 1 && vocab <= INT32_MAX && !*end) continue;
        else return tokenize_usage();
    }
    if (optind != argc) {
        fprintf(stderr, "fsdpctl tokenize: JSONL data with a tokenizer is not built yet; "
                        "only --from-safetensors is\n");
        return 2;
    }
    if (!from || !out) return tokenize_usage();
    errbuf err;
    if (tokenize_batch_file(from, out, vocab, &err)) {
        fprintf(stderr, "fsdpctl tokenize: %s\n", err.msg);
        return 1;
    }
    return 0;
}
