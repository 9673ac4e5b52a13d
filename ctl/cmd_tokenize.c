/* fsdpctl tokenize: data into a token cache (proto/tokens.h), and text into ids with a
 * Hugging Face tokenizer (data/tokenizer.h).
 *
 * --tokenizer PATH (a model directory or a tokenizer.json) with one of
 *   --text TEXT      prints the ids (--json: {"ids":[...]})
 *   --decode "1 2 3" prints the text, special tokens kept (--json: {"text":"..."})
 *   --jsonl FILE     one line out a line in: {"text": T} -> its ids, {"ids": [...]} -> {"text": ...}
 * --no-add-special leaves out the post-processor's BOS/EOS; --split-special encodes special
 * token text as plain text (tokenizers' encode_special_tokens=True).
 *
 * --data FILE.jsonl --format alpaca|chat|text|preference [--template T] --seq-len N: a user's JSONL file
 * into a cache (data/cache_build.h) on every core (--threads), a progress bar on stderr when it
 * is a terminal: --out CACHE writes it, --show K prints the first K samples as text with the
 * loss-bearing tokens between « and », with their ids and labels, --dump-jsonl OUT writes one
 * {"input_ids": [...], "labels": [...]} line a sample (labels -100 where no loss).
 * --no-truncate refuses a sample longer than --seq-len instead of cutting it;
 * --on-bad-record skip passes over bad records (counted) instead of stopping at the first.
 * --format preference makes a cache of pairs (data/sample.h; --truncation-mode keep_start or
 * keep_end, data.truncation_mode): --show K prints K pairs, each side with its prompt, and
 * the counts are of pairs.
 *
 * --from-safetensors FILE: a batch file (proto/batch.h, the golden references' form) whose
 * rows become records, one a row, in order: every input id is a token, and a label either
 * repeats its row's input id (a training target, mask 1) or is -100 (context, mask 0).  A
 * cache keeps a loss mask, not free labels, so any other label is refused.  With --pairs the
 * rows are preference pairs (train.objective dpo, orpo): rows 2i and 2i+1 the prompt + chosen
 * and prompt + rejected of pair i, labels on the completion only: a cache of pairs
 * (proto/tokens.h's TOK_FORMAT_PAIRS); an odd row count, or a row without a completion or
 * with a label before its prompt ends, is refused. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/fileio.h"
#include "ctl/fsdpctl.h"
#include "data/cache_build.h"
#include "data/rows.h"
#include "data/tokenizer.h"
#include "proto/batch.h"
#include "proto/tokens.h"

enum { IGNORE_INDEX = -100 };

static int tokenize_usage(void) {
    fprintf(stderr, "usage: fsdpctl tokenize --from-safetensors FILE --out CACHE [--vocab V] [--pairs]\n"
                    "  (FILE holds input_ids and labels [N, T]; one record a row; --pairs: rows 2i, 2i+1\n"
                    "  the chosen and rejected of pair i)\n"
                    "       fsdpctl tokenize --tokenizer PATH (--text TEXT | --decode \"1 2 3\" | "
                    "--jsonl FILE)\n"
                    "                        [--no-add-special] [--split-special] [--json]\n"
                    "       fsdpctl tokenize --tokenizer PATH --data FILE.jsonl --format "
                    "alpaca|chat|text|preference\n"
                    "                        [--template llama3|llama2|chatml|qwen2|qwen2.5|qwen3|mistral|\n"
                    "                        mistral-v3|mistral-tekken|alpaca|auto] "
                    "--seq-len N\n"
                    "                        [--out CACHE] [--show K] [--dump-jsonl OUT] "
                    "[--no-truncate]\n"
                    "                        [--on-bad-record fail|skip] [--threads N]\n"
                    "                        [--truncation-mode keep_start|keep_end] (preference)\n");
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

/* --pairs: every row a prompt (no label), then a completion (labels), then nothing labelled. */
static int check_pair_rows(const batch_file *b, const char *path, errbuf *err) {
    if (b->B % 2) return errf(err, "%s: --pairs with %d rows: pairs need an even count", path, b->B);
    for (int r = 0; r < b->B; r++) {
        const int32_t *labels = b->labels + (size_t)r * b->T;
        int t = 0;
        while (t < b->T && labels[t] == IGNORE_INDEX) t++;
        if (t == 0 || t == b->T)
            return errf(err, "%s: --pairs: row %d has %s", path, r, t ? "no completion (no label)" : "no prompt");
        while (t < b->T && labels[t] != IGNORE_INDEX) t++;
        while (t < b->T && labels[t] == IGNORE_INDEX) t++;
        if (t < b->T) return errf(err, "%s: --pairs: row %d's labels are not one run after its prompt", path, r);
    }
    return 0;
}

static int tokenize_batch_file(const char *path, const char *out, long vocab, bool pairs, errbuf *err) {
    batch_file b;
    if (batch_read(&b, path, err)) return -1;
    if (pairs && check_pair_rows(&b, path, err)) {
        batch_free(&b);
        return -1;
    }
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
    if (pairs) w.source.format = TOK_FORMAT_PAIRS;
    for (int r = 0; rc == 0 && r < b.B; r++) rc = add_row(&w, &b, r, mask, path, err);
    if (rc == 0) rc = tok_writer_save(&w, out, err);
    if (rc == 0)
        printf("wrote %s: %d records of %d tokens from %s (vocab %ld)%s\n", out, b.B, b.T, path,
               vocab, pairs ? ", in preference pairs" : "");
    tok_writer_free(&w);
    free(mask);
    batch_free(&b);
    return rc;
}

/* ---- with a tokenizer ------------------------------------------------------------------ */

typedef struct tok_opts {
    const char *tokenizer, *text, *decode, *jsonl;
    int flags, json;
} tok_opts;

static void print_ids(const tk_ids *ids, int json) {
    fputs(json ? "{\"ids\":[" : "", stdout);
    for (size_t i = 0; i < ids->n; i++) printf(i ? (json ? ",%d" : " %d") : "%d", ids->v[i]);
    fputs(json ? "]}\n" : "\n", stdout);
}

static void print_text(const char *s, size_t n, int json) {
    if (!json) {
        fwrite(s, 1, n, stdout);
        putchar('\n');
        return;
    }
    json_t *o = json_pack("{s:s%}", "text", s, n);
    char *dump = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    printf("%s\n", dump ? dump : "{\"text\":null}");
    free(dump);
    json_decref(o);
}

static int encode_print(const tokenizer *tk, tk_state *st, const char *s, size_t n, const tok_opts *o,
                        errbuf *err) {
    tk_ids ids = {0};
    int rc = tokenizer_encode(tk, st, s, n, o->flags, &ids, err);
    if (rc == 0) print_ids(&ids, o->json);
    tk_ids_free(&ids);
    return rc;
}

static int decode_print(const tokenizer *tk, const int32_t *ids, size_t n, int json, errbuf *err) {
    size_t len;
    char *text = tokenizer_decode(tk, ids, n, &len, err);
    if (!text) return -1;
    print_text(text, len, json);
    free(text);
    return 0;
}

/* "1 2 3" (spaces, commas or tabs between) as ids. */
static int parse_id_list(const char *s, tk_ids *ids, errbuf *err) {
    while (*s) {
        if (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') {
            s++;
            continue;
        }
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX || (*end && !strchr(" ,\t\n", *end)))
            return errf(err, "--decode: \"%s\" is not a list of ids", s);
        if (tk_ids_push(ids, (int32_t)v)) return errf(err, "out of memory");
        s = end;
    }
    return 0;
}

static int decode_ids_json(const tokenizer *tk, json_t *arr, errbuf *err) {
    tk_ids ids = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(arr); i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            rc = errf(err, "\"ids\"[%zu] is not an id", i);
        else if (tk_ids_push(&ids, (int32_t)json_integer_value(v))) rc = errf(err, "out of memory");
    }
    if (rc == 0) rc = decode_print(tk, ids.v, ids.n, 1, err);
    tk_ids_free(&ids);
    return rc;
}

static int jsonl_line(const tokenizer *tk, tk_state *st, const char *line, size_t n,
                      const tok_opts *o, errbuf *err) {
    json_error_t je;
    json_t *obj = json_loadb(line, n, JSON_ALLOW_NUL, &je);
    json_t *text = json_object_get(obj, "text"), *ids = json_object_get(obj, "ids");
    int rc;
    if (json_is_string(text))
        rc = encode_print(tk, st, json_string_value(text), json_string_length(text), o, err);
    else if (json_is_array(ids)) rc = decode_ids_json(tk, ids, err);
    else rc = errf(err, "not an object with a \"text\" string or an \"ids\" list");
    json_decref(obj);
    return rc;
}

static int tokenize_jsonl(const tokenizer *tk, tk_state *st, const tok_opts *o, errbuf *err) {
    int fd = strcmp(o->jsonl, "-") ? file_open_regular(o->jsonl, err) : STDIN_FILENO; /* "-": a pipe is fine */
    if (fd < 0) return -1;
    FILE *f = fd == STDIN_FILENO ? stdin : fdopen(fd, "r");
    if (!f) {
        close(fd);
        return errf(err, "%s: fdopen: %s", o->jsonl, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    for (long no = 1; rc == 0 && (n = getline(&line, &cap, f)) >= 0; no++)
        if (jsonl_line(tk, st, line, (size_t)n, o, err)) rc = errprefix(err, "%s:%ld", o->jsonl, no);
    if (rc == 0 && ferror(f)) rc = errf(err, "%s: read error", o->jsonl);
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

static int tokenize_with(const tok_opts *o, errbuf *err) {
    tokenizer *tk = tokenizer_load(o->tokenizer, err);
    if (!tk) return -1;
    if (tokenizer_note(tk)[0]) fprintf(stderr, "fsdpctl tokenize: %s\n", tokenizer_note(tk));
    tk_state *st = tk_state_new(tk);
    int rc = st ? 0 : errf(err, "out of memory");
    tk_ids ids = {0};
    if (rc == 0 && o->text) rc = encode_print(tk, st, o->text, strlen(o->text), o, err);
    else if (rc == 0 && o->decode) {
        rc = parse_id_list(o->decode, &ids, err);
        if (rc == 0) rc = decode_print(tk, ids.v, ids.n, o->json, err);
    } else if (rc == 0) rc = tokenize_jsonl(tk, st, o, err);
    tk_ids_free(&ids);
    tk_state_free(st);
    tokenizer_free(tk);
    return rc;
}

/* ---- a JSONL data file into a cache --------------------------------------------------- */

typedef struct data_opts {
    const char *data, *format, *template_name, *out, *dump;
    int seq_len, show, threads;
    bool truncate, skip_bad, keep_end;
} data_opts;

/* The text of ids[from, to) as the prefix decodes grow (decoding a run alone would lose a
 * leading space to the decoder's Strip). */
static int print_span(const tokenizer *tk, const int32_t *ids, size_t from, size_t to, errbuf *err) {
    size_t a = 0, b;
    char *head = from ? tokenizer_decode(tk, ids, from, &a, err) : NULL;
    char *all = tokenizer_decode(tk, ids, to, &b, err);
    int rc = (from && !head) || !all ? -1 : 0;
    if (rc == 0 && b >= a) fwrite(all + a, 1, b - a, stdout);
    free(head);
    free(all);
    return rc;
}

static void print_list(const char *name, const int32_t *ids, const uint8_t *mask, size_t n) {
    fputs(name, stdout);
    for (size_t i = 0; i < n; i++) printf(" %d", !mask || mask[i] ? ids[i] : -100);
    putchar('\n');
}

/* Record r: "sample K", or in a cache of pairs "pair K, chosen" / "pair K, rejected" (the
 * prompt is the text before the first «). */
static int show_sample(const tokenizer *tk, const tok_writer *w, uint64_t r, errbuf *err) {
    const int32_t *ids = w->tokens + w->offsets[r];
    const uint8_t *mask = w->mask + w->offsets[r];
    size_t n = w->offsets[r + 1] - w->offsets[r], loss = 0, prompt = 0;
    for (size_t i = 0; i < n; i++) loss += mask[i];
    while (prompt < n && !mask[prompt]) prompt++;
    if (tok_format_pairs(w->source.format))
        printf("pair %llu, %s: %zu tokens, the prompt's %zu, %zu with loss (between « and »)\n",
               (unsigned long long)r / 2 + 1, r % 2 ? "rejected" : "chosen", n, prompt, loss);
    else printf("sample %llu: %zu tokens, %zu with loss (between « and »)\n", (unsigned long long)r + 1, n, loss);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && mask[j] == mask[i]) j++;
        fputs(mask[i] ? "«" : "", stdout);
        if (print_span(tk, ids, i, j, err)) return -1;
        fputs(mask[i] ? "»" : "", stdout);
        i = j;
    }
    putchar('\n');
    print_list("input_ids:", ids, NULL, n);
    print_list("labels:", ids, mask, n);
    return 0;
}

static int dump_jsonl(const tok_writer *w, const char *path, errbuf *err) {
    FILE *f = fopen(path, "w");
    if (!f) return errf(err, "%s: cannot create", path);
    for (uint64_t r = 0; r < w->n_records; r++) {
        uint64_t a = w->offsets[r], b = w->offsets[r + 1];
        fputs("{\"input_ids\": [", f);
        for (uint64_t i = a; i < b; i++) fprintf(f, i > a ? ", %d" : "%d", w->tokens[i]);
        fputs("], \"labels\": [", f);
        for (uint64_t i = a; i < b; i++) fprintf(f, i > a ? ", %d" : "%d", w->mask[i] ? w->tokens[i] : -100);
        fputs("]}\n", f);
    }
    if (ferror(f) | fclose(f)) return errf(err, "%s: write error", path);
    return 0;
}

static int show_and_save(const char *tk_path, const data_opts *d, const tok_writer *w, errbuf *err) {
    if (d->show) {
        tokenizer *tk = tokenizer_load(tk_path, err);
        if (!tk) return -1;
        int rc = 0;
        uint64_t shown = (uint64_t)d->show * (tok_format_pairs(w->source.format) ? 2 : 1); /* --show K: K pairs */
        for (uint64_t r = 0; rc == 0 && r < w->n_records && r < shown; r++)
            rc = show_sample(tk, w, r, err);
        tokenizer_free(tk);
        if (rc) return -1;
    }
    if (d->dump && dump_jsonl(w, d->dump, err)) return -1;
    return d->out ? tok_writer_save(w, d->out, err) : 0;
}

/* What data.packing would make of the samples: rows, and real tokens over row tokens, beside
 * padding every sample to a row of its own. */
static int print_packing(const tok_writer *w, int seq_len, errbuf *err) {
    tok_cache view = {.path = "the samples", .n_records = w->n_records, .n_tokens = w->n_tokens,
                      .offsets = w->offsets, .tokens = w->tokens, .mask = w->mask};
    uint64_t *starts, rows, real;
    if (w->n_records == 0 || tok_format_pairs(w->source.format)) return 0; /* pairs are not packed */
    if (rows_pack(&view, seq_len, &starts, &rows, &real, err)) return -1;
    free(starts);
    printf("packing (data.packing=true): %llu rows of %d, efficiency %.1f%% (real tokens / row tokens); "
           "one sample a row: %.1f%%\n", (unsigned long long)rows, seq_len,
           100.0 * (double)real / ((double)rows * seq_len), 100.0 * (double)real / ((double)w->n_records * seq_len));
    return 0;
}

static int tokenize_data(const char *tk_path, const data_opts *d, errbuf *err) {
    cache_build_opts o = {.tokenizer = tk_path, .data = d->data, .seq_len = d->seq_len,
                          .truncate = d->truncate, .threads = d->threads, .log = stderr,
                          .on_bad_record = d->skip_bad ? JOB_BAD_RECORD_SKIP : JOB_BAD_RECORD_FAIL,
                          .progress = isatty(2)};
    if (!strcmp(d->format, "alpaca")) o.format = JOB_DATA_ALPACA;
    else if (!strcmp(d->format, "chat")) o.format = JOB_DATA_CHAT;
    else if (!strcmp(d->format, "text")) o.format = JOB_DATA_TEXT;
    else if (!strcmp(d->format, "preference")) o.format = JOB_DATA_PREFERENCE;
    else return errf(err, "--format: '%s' is not alpaca, chat, text or preference", d->format);
    if (d->keep_end && o.format != JOB_DATA_PREFERENCE)
        return errf(err, "--truncation-mode keep_end: for --format preference only");
    o.truncation_mode = d->keep_end ? JOB_TRUNC_KEEP_END : JOB_TRUNC_KEEP_START;
    if (resolve_template(d->template_name ? d->template_name : "", o.format, tk_path, &o.tpl, err))
        return -1;
    tok_writer w;
    cache_build_stats st;
    int rc = cache_build(&o, &w, &st, err);
    if (rc == 0) rc = show_and_save(tk_path, d, &w, err);
    if (rc == 0)
        printf("%s%s: %llu %s (%llu tokens, %llu with loss) from %llu records; %llu skipped, "
               "%llu dropped (no loss token), %llu truncated; format %s, template %s\n",
               d->out ? "wrote " : "", d->out ? d->out : d->data, (unsigned long long)st.samples,
               o.format == JOB_DATA_PREFERENCE ? "pairs" : "samples",
               (unsigned long long)st.tokens, (unsigned long long)st.loss_tokens,
               (unsigned long long)st.lines, (unsigned long long)st.skipped,
               (unsigned long long)st.dropped, (unsigned long long)st.truncated, d->format,
               chat_template_name((chat_template)w.source.template_id));
    if (rc == 0) rc = print_packing(&w, d->seq_len, err);
    tok_writer_free(&w);
    return rc;
}

static int parse_count(const char *s, int lo, int *out) { return fsdpctl_parse_int(s, lo, 1 << 30, out); }

int cmd_tokenize(int argc, char **argv) {
    const char *from = NULL, *out = NULL;
    long vocab = 0;
    tok_opts o = {.flags = TK_ADD_SPECIAL};
    static const struct option longopts[] = {{"from-safetensors", required_argument, 0, 'f'},
                                             {"out", required_argument, 0, 'o'},
                                             {"vocab", required_argument, 0, 'v'},
                                             {"tokenizer", required_argument, 0, 't'},
                                             {"text", required_argument, 0, 'x'},
                                             {"decode", required_argument, 0, 'd'},
                                             {"jsonl", required_argument, 0, 'l'},
                                             {"no-add-special", no_argument, 0, 'n'},
                                             {"split-special", no_argument, 0, 's'},
                                             {"json", no_argument, 0, 'j'},
                                             {"data", required_argument, 0, 'D'},
                                             {"format", required_argument, 0, 'F'},
                                             {"template", required_argument, 0, 'T'},
                                             {"seq-len", required_argument, 0, 'L'},
                                             {"show", required_argument, 0, 'S'},
                                             {"dump-jsonl", required_argument, 0, 'J'},
                                             {"threads", required_argument, 0, 'P'},
                                             {"no-truncate", no_argument, 0, 'N'},
                                             {"on-bad-record", required_argument, 0, 'B'},
                                             {"pairs", no_argument, 0, 'p'},
                                             {"truncation-mode", required_argument, 0, 'M'},
                                             {0, 0, 0, 0}};
    data_opts d = {.truncate = true};
    bool pairs = false;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end;
        if (opt == 'f') from = optarg;
        else if (opt == 'o') out = optarg;
        else if (opt == 'v' && (vocab = strtol(optarg, &end, 10)) >= 1 && vocab <= INT32_MAX && !*end) continue;
        else if (opt == 't') o.tokenizer = optarg;
        else if (opt == 'x') o.text = optarg;
        else if (opt == 'd') o.decode = optarg;
        else if (opt == 'l') o.jsonl = optarg;
        else if (opt == 'n') o.flags &= ~TK_ADD_SPECIAL;
        else if (opt == 's') o.flags |= TK_SPLIT_SPECIAL;
        else if (opt == 'j') o.json = 1;
        else if (opt == 'D') d.data = optarg;
        else if (opt == 'F') d.format = optarg;
        else if (opt == 'T') d.template_name = optarg;
        else if (opt == 'L' && parse_count(optarg, 2, &d.seq_len) == 0) continue;
        else if (opt == 'S' && parse_count(optarg, 0, &d.show) == 0) continue;
        else if (opt == 'P' && parse_count(optarg, 1, &d.threads) == 0) continue;
        else if (opt == 'J') d.dump = optarg;
        else if (opt == 'N') d.truncate = false;
        else if (opt == 'p') pairs = true;
        else if (opt == 'M' && (!strcmp(optarg, "keep_start") || !strcmp(optarg, "keep_end")))
            d.keep_end = !strcmp(optarg, "keep_end");
        else if (opt == 'B' && (!strcmp(optarg, "skip") || !strcmp(optarg, "fail"))) d.skip_bad = !strcmp(optarg, "skip");
        else {
            if (opt == '?') ctl_flag_error("tokenize", argv);
            else fprintf(stderr, "fsdpctl tokenize: %s: bad value\n", argv[optind - 1]);
            return tokenize_usage();
        }
    }
    if (optind != argc) {
        fprintf(stderr, "fsdpctl tokenize: unexpected argument '%s'\n", argv[optind]);
        return tokenize_usage();
    }
    errbuf err;
    if (d.data) {
        d.out = out;
        if (!o.tokenizer || !d.format || !d.seq_len || from || o.text || o.decode || o.jsonl ||
            (!out && !d.show && !d.dump))
            return tokenize_usage();
        if (tokenize_data(o.tokenizer, &d, &err)) {
            fprintf(stderr, "fsdpctl tokenize: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    if (o.tokenizer && out) return tokenize_usage();
    if (o.tokenizer) {
        if (from || !!o.text + !!o.decode + !!o.jsonl != 1) return tokenize_usage();
        if (tokenize_with(&o, &err)) {
            fprintf(stderr, "fsdpctl tokenize: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    if (!from || !out) return tokenize_usage();
    if (tokenize_batch_file(from, out, vocab, pairs, &err)) {
        fprintf(stderr, "fsdpctl tokenize: %s\n", err.msg);
        return 1;
    }
    return 0;
}
