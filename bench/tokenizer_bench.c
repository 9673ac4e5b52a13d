/* Tokenizer throughput: encodes every line of a text file with one thread (one tk_state, no
 * special tokens added) and prints MB/s of text, not counting the load.
 *
 * usage: tokenizer_bench TOKENIZER TEXT_FILE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/tokenizer.h"
#include "base/fileio.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: tokenizer_bench TOKENIZER TEXT_FILE\n");
        return 2;
    }
    errbuf err = {{0}};
    double t0 = now();
    tokenizer *tk = tokenizer_load(argv[1], &err);
    if (!tk) {
        fprintf(stderr, "tokenizer_bench: %s\n", err.msg);
        return 1;
    }
    double load_s = now() - t0;
    char *text;
    size_t len;
    tk_state *st = tk_state_new(tk);
    if (!st || file_read_all(argv[2], (size_t)1 << 34, &text, &len, &err)) {
        fprintf(stderr, "tokenizer_bench: %s\n", st ? err.msg : "out of memory");
        return 1;
    }
    tk_ids ids = {0};
    size_t tokens = 0, lines = 0;
    t0 = now();
    for (char *p = text, *end = text + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        ids.n = 0;
        if (tokenizer_encode(tk, st, p, n, 0, &ids, &err)) {
            fprintf(stderr, "tokenizer_bench: line %zu: %s\n", lines + 1, err.msg);
            return 1;
        }
        tokens += ids.n;
        lines++;
        p += n + 1;
    }
    double s = now() - t0;
    printf("fsdpd      %-40s %8.1f MB in %6.2f s: %7.2f MB/s, %zu lines, %zu tokens (load %.2f s)\n",
           argv[1], len / 1e6, s, len / 1e6 / s, lines, tokens, load_s);
    tk_ids_free(&ids);
    tk_state_free(st);
    tokenizer_free(tk);
    free(text);
    return 0;
}
