/* Token cache and CRC32C; the rows data/rows assembles from a cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "data/rows.h"
#include "model/llama.h"
#include "proto/tokens.h"

static char tmpdir[] = "/tmp/fsdp-test-tokens-XXXXXX";

static void path_in_tmp(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", tmpdir, name);
}

static void test_crc32c_known_values(void **state) {
    (void)state;
    /* The standard check value of CRC-32C. */
    assert_int_equal(crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c_portable(0, "123456789", 9), 0xE3069283u);
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
    for (size_t len = 0; len < sizeof buf; len += 37) {
        assert_int_equal(crc32c(0, buf, len), crc32c_portable(0, buf, len));
        /* chaining equals one pass */
        uint32_t a = crc32c(crc32c(0, buf, len / 3), buf + len / 3, len - len / 3);
        assert_int_equal(a, crc32c(0, buf, len));
        /* and so does combining the two pieces' own CRCs */
        uint32_t head = crc32c(0, buf, len / 3), tail = crc32c(0, buf + len / 3, len - len / 3);
        assert_int_equal(crc32c_combine(head, tail, len - len / 3), crc32c(0, buf, len));
    }
}

/* Three records: a prompt/answer pair, a plain run, an empty record. */
static void write_sample_cache(const char *path, tok_writer *w) {
    errbuf err;
    tok_writer_init(w, 100);
    int32_t a[] = {1, 5, 6, 3, 7, 8, 2};
    uint8_t am[] = {0, 0, 0, 0, 1, 1, 1};
    int32_t b[] = {9, 10, 11};
    uint8_t bm[] = {1, 1, 1};
    assert_int_equal(tok_writer_add(w, a, am, 7, &err), 0);
    assert_int_equal(tok_writer_add(w, b, bm, 3, &err), 0);
    assert_int_equal(tok_writer_add(w, NULL, NULL, 0, &err), 0);
    assert_int_equal(tok_writer_save(w, path, &err), 0);
}

/* The three records above, written to NAME in the test's directory and opened. */
static void open_sample_cache(const char *name, tok_cache *c) {
    char path[512];
    errbuf err;
    tok_writer w;
    path_in_tmp(path, sizeof path, name);
    write_sample_cache(path, &w);
    tok_writer_free(&w);
    assert_int_equal(tok_open(c, path, &err), 0);
}

static void write_text(const char *name, const char *text, char *path, size_t n) {
    path_in_tmp(path, n, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* F37: what a data file is comes from its content, whatever its name says. */
static void test_probe_by_content(void **state) {
    (void)state;
    static const struct {
        const char *name, *text;
        tok_file_kind kind;
    } cases[] = {
        {"chat.json", "{\"messages\": []}\n{\"messages\": []}\n", TOK_FILE_JSONL},
        {"x.tokens", "\n  \t{\"text\": \"a\"}\n", TOK_FILE_JSONL},
        {"array.jsonl", " [{\"text\": \"a\"}]", TOK_FILE_JSON_ARRAY},
        {"empty.jsonl", " \n\n", TOK_FILE_EMPTY},
        {"notes.jsonl", "hello", TOK_FILE_OTHER},
        {"short.tokens", "FSDPTOK", TOK_FILE_OTHER},
    };
    char path[512];
    errbuf err;
    tok_file_kind kind;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(cases[i].name, cases[i].text, path, sizeof path);
        assert_int_equal(tok_probe(path, &kind, &err), 0);
        assert_int_equal(kind, cases[i].kind);
    }
    tok_cache c;
    open_sample_cache("probe.jsonl", &c); /* a cache, named like JSONL */
    tok_close(&c);
    path_in_tmp(path, sizeof path, "probe.jsonl");
    assert_int_equal(tok_probe(path, &kind, &err), 0);
    assert_int_equal(kind, TOK_FILE_CACHE);
    assert_string_equal(tok_file_kind_name(TOK_FILE_CACHE), "a token cache");
    assert_string_equal(tok_file_kind_name(TOK_FILE_JSONL), "JSONL");
    path_in_tmp(path, sizeof path, "missing");
    assert_int_equal(tok_probe(path, &kind, &err), -1);
    assert_non_null(strstr(err.msg, "missing"));
    assert_int_equal(tok_probe(tmpdir, &kind, &err), -1); /* a directory */
}

static void test_round_trip_and_samples(void **state) {
    (void)state;
    tok_cache c;
    open_sample_cache("a.tok", &c);
    assert_int_equal(c.n_records, 3);
    assert_int_equal(c.n_tokens, 10);
    assert_int_equal(c.vocab_size, 100);
    assert_int_equal(tok_record_len(&c, 0), 7);
    assert_int_equal(tok_record_len(&c, 2), 0);

    int32_t ids[9], labels[9];
    row_fill_record(&c, 0, 9, ids, labels);
    int32_t want_ids[] = {1, 5, 6, 3, 7, 8, 2, 0, 0};
    int32_t want_labels[] = {-100, -100, -100, -100, 7, 8, 2, -100, -100};
    assert_memory_equal(ids, want_ids, sizeof ids);
    assert_memory_equal(labels, want_labels, sizeof labels);
    row_fill_record(&c, 1, 2, ids, labels); /* truncated */
    assert_int_equal(ids[0], 9);
    assert_int_equal(ids[1], 10);
    assert_int_equal(labels[1], 10);
    tok_close(&c);
}

/* A packed row's document bounds are those of the positions want_pos[n] (restarting at each
 * record, llama_doc_bounds), and t - start[t] is each token's position. */
static void assert_positions(const int32_t *start, const int32_t *end, const int32_t *want_pos,
                             int n) {
    int32_t want_start[16], want_end[16];
    errbuf err;
    assert_true(n <= 16);
    assert_int_equal(llama_doc_bounds(want_pos, 1, n, want_start, want_end, &err), 0);
    assert_memory_equal(start, want_start, (size_t)n * sizeof *start);
    assert_memory_equal(end, want_end, (size_t)n * sizeof *end);
    for (int t = 0; t < n; t++) assert_int_equal(t - start[t], want_pos[t]);
}

/* Packing: records 0 (7 tokens) and 1 (3) fill a row of 10 with the empty record 2; at seq 9
 * record 1 starts a row of its own.  Positions restart at each record, each record's first
 * label is -100, the padding is one more document. */
static void test_packing(void **state) {
    (void)state;
    tok_cache c;
    errbuf err;
    open_sample_cache("pack.tok", &c);
    uint64_t *starts, rows, real;
    assert_int_equal(rows_pack(&c, 10, &starts, &rows, &real, &err), 0);
    assert_int_equal(rows, 1);
    assert_int_equal(real, 10);
    int32_t ids[12], labels[12], start[12], end[12];
    row_fill_packed(&c, starts, 0, 10, ids, labels, start, end);
    int32_t want_ids[] = {1, 5, 6, 3, 7, 8, 2, 9, 10, 11};
    int32_t want_labels[] = {-100, -100, -100, -100, 7, 8, 2, -100, 10, 11};
    int32_t want_pos[] = {0, 1, 2, 3, 4, 5, 6, 0, 1, 2};
    assert_memory_equal(ids, want_ids, sizeof want_ids);
    assert_memory_equal(labels, want_labels, sizeof want_labels);
    assert_positions(start, end, want_pos, 10);
    free(starts);

    assert_int_equal(rows_pack(&c, 9, &starts, &rows, &real, &err), 0);
    assert_int_equal(rows, 2); /* 7 + 3 > 9 */
    assert_int_equal(starts[0], 0);
    assert_int_equal(starts[1], 1);
    assert_int_equal(starts[2], 3);
    row_fill_packed(&c, starts, 1, 9, ids, labels, start, end); /* record 1, the empty record 2, padding */
    int32_t want_ids1[] = {9, 10, 11, 0, 0, 0, 0, 0, 0};
    int32_t want_labels1[] = {-100, 10, 11, -100, -100, -100, -100, -100, -100};
    int32_t want_pos1[] = {0, 1, 2, 0, 1, 2, 3, 4, 5};
    assert_memory_equal(ids, want_ids1, sizeof want_ids1);
    assert_memory_equal(labels, want_labels1, sizeof want_labels1);
    assert_positions(start, end, want_pos1, 9);
    free(starts);

    assert_int_equal(rows_pack(&c, 5, &starts, &rows, &real, &err), 0); /* record 0 cut at 5 */
    assert_int_equal(rows, 2);
    assert_int_equal(real, 8);
    row_fill_packed(&c, starts, 0, 5, ids, labels, start, end);
    assert_int_equal(4 - start[4], 4);
    assert_int_equal(labels[4], 7);
    free(starts);
    tok_close(&c);
}

static void test_writer_rejects_bad_token(void **state) {
    (void)state;
    tok_writer w;
    errbuf err;
    tok_writer_init(&w, 50);
    int32_t t[] = {3, 50};
    uint8_t m[] = {1, 1};
    assert_int_equal(tok_writer_add(&w, t, m, 2, &err), -1);
    assert_non_null(strstr(err.msg, "50"));
    tok_writer_free(&w);
}

/* Loads the sample file into memory for corruption tests. */
static unsigned char *load_sample(size_t *len) {
    char path[512];
    path_in_tmp(path, sizeof path, "b.tok");
    tok_writer w;
    write_sample_cache(path, &w);
    tok_writer_free(&w);
    char *buf;
    errbuf err;
    assert_int_equal(file_read_all(path, 1 << 20, &buf, len, &err), 0);
    return (unsigned char *)buf;
}

static void expect_reject(const unsigned char *buf, size_t len, const char *needle) {
    tok_cache c;
    errbuf err;
    assert_int_equal(tok_parse(&c, buf, len, "bad.tok", &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    assert_non_null(strstr(err.msg, "bad.tok"));
}

static void test_rejects_corruption(void **state) {
    (void)state;
    size_t len;
    unsigned char *buf = load_sample(&len);
    tok_cache c;
    errbuf err;
    assert_int_equal(tok_parse(&c, buf, len, "ok.tok", &err), 0);
    tok_close(&c);

    expect_reject(buf, 10, "too short");
    expect_reject(buf, len - 8, "size");
    unsigned char *copy = malloc(len);
    memcpy(copy, buf, len);
    copy[0] = 'X';
    expect_reject(copy, len, "magic");
    memcpy(copy, buf, len);
    copy[len - 20] ^= 1; /* a token's bits */
    expect_reject(copy, len, "checksum");
    memcpy(copy, buf, len);
    copy[8] = 1; /* version 1: the header before it named the tokenizer */
    expect_reject(copy, len, "version");
    free(copy);
    /* Counts whose sizes each fit but whose sum wraps around to the file's size (the fuzzer
     * found it: the offsets then pointed past the end): 2^61 - 10 records and 33 tokens make
     * 2^64 + 228 bytes, a 228-byte file with its checksum right. */
    unsigned char wrap[228] = {0};
    uint32_t version = TOK_VERSION, vocab = 40;
    uint64_t records = 0x1ffffffffffffff6ull, tokens = 0x21;
    memcpy(wrap, TOK_MAGIC, 8);
    memcpy(wrap + 8, &version, 4);
    memcpy(wrap + 12, &vocab, 4);
    memcpy(wrap + 16, &records, 8);
    memcpy(wrap + 24, &tokens, 8);
    uint32_t crc = tok_checksum(wrap, sizeof wrap);
    memcpy(wrap + TOK_CRC_OFFSET, &crc, 4);
    expect_reject(wrap, sizeof wrap, "does not match");
    free(buf);
}

/* The header's provenance (format, template, tokenizer hash) round-trips, is covered by the
 * checksum, and must be consistent. */
static void test_source_round_trip_and_strict(void **state) {
    (void)state;
    char path[512];
    path_in_tmp(path, sizeof path, "s.tok");
    tok_writer w;
    errbuf err;
    tok_writer_init(&w, 100);
    int32_t t[] = {1, 2};
    uint8_t m[] = {0, 1};
    assert_int_equal(tok_writer_add(&w, t, m, 2, &err), 0);
    assert_int_equal(tok_writer_add(&w, t, m, 2, &err), 0); /* two: a pair, below */
    w.source.format = TOK_FORMAT_CHAT;
    w.source.template_id = 2;
    memset(w.source.tokenizer_sha256, 0xab, TOK_SHA256_BYTES);
    assert_int_equal(tok_writer_save(&w, path, &err), 0);
    tok_writer_free(&w);
    tok_cache c;
    assert_int_equal(tok_open(&c, path, &err), 0);
    assert_int_equal(c.source.format, TOK_FORMAT_CHAT);
    assert_int_equal(c.source.template_id, 2);
    assert_int_equal(c.source.tokenizer_sha256[31], 0xab);
    tok_close(&c);
    tok_source src;
    assert_int_equal(tok_read_source(path, &src, &err), 0);
    assert_int_equal(src.template_id, 2);

    char *buf;
    size_t len;
    assert_int_equal(file_read_all(path, 1 << 20, &buf, &len, &err), 0);
    unsigned char *b = (unsigned char *)buf;
    b[48] ^= 1; /* a hash byte: the checksum covers it */
    expect_reject(b, len, "checksum");
    b[48] ^= 1;
    struct { size_t off; uint8_t value; const char *needle; } bad[] = {
        {36, 0, "with a tokenizer hash"}, /* format tokens */
        {36, 6, "unknown format"},
        {36, TOK_FORMAT_PAIRS, "with a tokenizer hash"}, /* --pairs: no tokenizer */
        {40, 0, "with template 0"},     /* chat without a template */
        {40, 11, "unknown template"}, /* data/chat_template.h has 1..10 */
        {44, 1, "reserved"},
        {100, 1, "reserved"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t keep = b[bad[i].off];
        b[bad[i].off] = bad[i].value;
        uint32_t crc = tok_checksum(b, len);
        memcpy(b + TOK_CRC_OFFSET, &crc, 4);
        expect_reject(b, len, bad[i].needle);
        b[bad[i].off] = keep;
    }
    /* a cache of preference JSONL: a tokenizer hash, and a template or none (string records) */
    for (uint8_t tpl = 0; tpl <= 2; tpl += 2) {
        b[36] = TOK_FORMAT_PREFERENCE, b[40] = tpl;
        uint32_t crc = tok_checksum(b, len);
        memcpy(b + TOK_CRC_OFFSET, &crc, 4);
        tok_cache p;
        if (tok_parse(&p, b, len, "pref", &err)) fail_msg("%s", err.msg);
        assert_true(tok_format_pairs(p.source.format));
        tok_close(&p);
    }
    memset(b + 48, 0, TOK_SHA256_BYTES);
    uint32_t crc = tok_checksum(b, len);
    memcpy(b + TOK_CRC_OFFSET, &crc, 4);
    expect_reject(b, len, "without a tokenizer hash");
    free(buf);
    assert_string_equal(tok_format_name(TOK_FORMAT_CHAT), "chat");
    assert_string_equal(tok_format_name(TOK_FORMAT_PAIRS), "pairs");
    assert_string_equal(tok_format_name(TOK_FORMAT_PREFERENCE), "preference");
    assert_string_equal(tok_format_name(TOK_FORMAT_PREFERENCE + 1), "unknown");
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_known_values),
        cmocka_unit_test(test_round_trip_and_samples),
        cmocka_unit_test(test_packing),
        cmocka_unit_test(test_probe_by_content),
        cmocka_unit_test(test_writer_rejects_bad_token),
        cmocka_unit_test(test_source_round_trip_and_strict),
        cmocka_unit_test(test_rejects_corruption),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
