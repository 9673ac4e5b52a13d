/* libFuzzer target for preference pairs (F49, data/sample.h): each line of the input as a
 * preference record through sample_from_line with the sp32k tokenizer of tests/fixtures
 * (string records without a template, conversational ones with llama2's), at a few seq_len
 * and both truncation modes.  A pair must come out as two sides of at most seq_len tokens,
 * each with a loss token; with keep_start both open with the same tokens before their first
 * loss token (the shared prompt, or its start); anything else must be a drop or an error with
 * a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jsonl.h"
#include "data/sample.h"

static tokenizer *tk;
static sample_buf buf;

static void load_once(void) {
    errbuf err = {{0}};
    if (tk) return;
    if (!(tk = tokenizer_load("tests/fixtures/tokenizers/sp32k-tokenizer.json", &err)) || sample_buf_init(&buf, tk, &err)) {
        fprintf(stderr, "fuzz_pref_sample: %s (run from the repository root)\n", err.msg);
        abort();
    }
}

static size_t first_loss(const uint8_t *m, size_t n) {
    size_t i = 0;
    while (i < n && !m[i]) i++;
    return i;
}

static void check_pair(const sample_spec *s, const sample_buf *b) {
    size_t nc = b->split, nr = b->ids.n - b->split;
    if (!nc || !nr || nc > (size_t)s->seq_len || nr > (size_t)s->seq_len) abort();
    size_t pc = first_loss(b->mask, nc), pr = first_loss(b->mask + nc, nr);
    if (pc == nc || pr == nr) abort();
    if (s->truncation_mode == JOB_TRUNC_KEEP_START &&
        (pc != pr || memcmp(b->ids.v, b->ids.v + nc, pc * sizeof *b->ids.v)))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    jsonl_cursor c;
    const char *line;
    size_t len;
    jsonl_cursor_init(&c, (const char *)data, size);
    while (jsonl_next(&c, &line, &len)) {
        bool conv;
        if (!record_pref_kind(line, len, &conv)) continue;
        for (int k = 0; k < 4; k++) {
            sample_spec s;
            errbuf err = {{0}};
            if (sample_spec_init(&s, tk, JOB_DATA_PREFERENCE, conv ? TPL_LLAMA2 : TPL_NONE, k < 2 ? 8 : 4096, true, &err))
                abort();
            s.pref_conversational = conv;
            s.truncation_mode = k % 2 ? JOB_TRUNC_KEEP_END : JOB_TRUNC_KEEP_START;
            int rc = sample_from_line(&s, &buf, line, len, &err);
            if (rc == SAMPLE_OK) check_pair(&s, &buf);
            else if (rc != SAMPLE_DROPPED && !err.msg[0]) abort();
        }
    }
    return 0;
}
