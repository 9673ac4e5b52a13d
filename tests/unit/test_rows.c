/* data/rows: the data order (each epoch a permutation, positions read alike in any batch)
 * and the eval split (which samples are held out and trained on, against the rule). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "data/rows.h"

/* A token cache of n records {r, r + 100} (record r's first token is r) at a new temporary
 * path (template, rewritten). */
static void write_records_as(char *path, int32_t n, uint32_t format) {
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    tok_writer w;
    errbuf err;
    tok_writer_init(&w, 1000);
    w.source.format = format;
    for (int32_t r = 0; r < n; r++) {
        int32_t t[2] = {r, r + 100};
        uint8_t m[2] = {1, 1};
        assert_int_equal(tok_writer_add(&w, t, m, 2, &err), 0);
    }
    assert_int_equal(tok_writer_save(&w, path, &err), 0);
    tok_writer_free(&w);
}

static void write_records(char *path, int32_t n) { write_records_as(path, n, TOK_FORMAT_TOKENS); }

/* The data order: each epoch is a permutation, different epochs differ, and the same
 * position gives the same sample whatever batch of positions it is read in. */
static void test_data_order(void **state) {
    (void)state;
    char path[] = "/tmp/fsdp-test-data-XXXXXX";
    errbuf err;
    write_records(path, 50);

    row_source d;
    assert_int_equal(row_source_open(&d, path, 2, 8, 42, true, false, 0, 1000, &err), 0);
    assert_int_equal(d.epoch_len, 48);
    assert_int_equal(row_source_steps_per_epoch(&d), 6);
    int32_t ids[96 * 2], labels[96 * 2];
    row_batch rows = {.n = 96, .seq_len = 2, .input_ids = ids, .labels = labels};
    row_source_fill(&d, 0, &rows);
    int seen[50] = {0}, same_order = 1;
    for (int i = 0; i < 48; i++) {
        seen[ids[2 * i]]++;
        same_order &= ids[2 * i] == ids[2 * (48 + i)];
        assert_int_equal(ids[2 * i + 1], ids[2 * i] + 100);
    }
    for (int r = 0; r < 50; r++) assert_true(seen[r] <= 1);
    assert_false(same_order); /* epoch 1 is shuffled differently */
    int32_t one[2], one_labels[2];
    row_batch row = {.n = 1, .seq_len = 2, .input_ids = one, .labels = one_labels};
    row_source_fill(&d, 57, &row);
    assert_int_equal(one[0], ids[2 * 57]);
    row_source_close(&d);

    /* Without shuffling every epoch is the file's order. */
    assert_int_equal(row_source_open(&d, path, 2, 8, 42, false, false, 0, 1000, &err), 0);
    row_source_fill(&d, 0, &rows);
    for (int i = 0; i < 96; i++) assert_int_equal(ids[2 * i], i % 48);
    row_source_close(&d);

    assert_int_equal(row_source_open(&d, path, 2, 64, 42, true, false, 0, 1000, &err), -1);
    assert_non_null(strstr(err.msg, "fewer than one global batch"));
    assert_int_equal(row_source_open(&d, path, 2, 8, 42, true, false, 0, 500, &err), -1);
    assert_non_null(strstr(err.msg, "vocabulary"));
    unlink(path);
}

/* held_out(i, p, q): the documented rule (configs/jobs/README.md, data.eval_fraction f = p/q)
 * in integers: sample i is held out when floor((i+1) f) > floor(i f). */
static int held_out(uint64_t i, uint64_t p, uint64_t q) { return (i + 1) * p / q > i * p / q; }

/* The eval split: which samples are held out and which are trained on, read back from what
 * row_source_fill and row_source_fill_eval fill (record r's first token is r), against the rule. */
static void test_eval_split(void **state) {
    (void)state;
    enum { RECORDS = 96 };
    char path[] = "/tmp/fsdp-test-split-XXXXXX";
    errbuf err;
    write_records(path, RECORDS);

    static const struct {
        double f;
        uint64_t p, q;
        bool shuffle;
    } cases[] = {{0.25, 1, 4, true}, {0.375, 3, 8, false}, {0.25, 1, 4, false}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t want_eval[RECORDS], want_train[RECORDS], n_eval = 0, n_train = 0;
        for (uint64_t i = 0; i < RECORDS; i++) {
            if (held_out(i, cases[c].p, cases[c].q)) want_eval[n_eval++] = i;
            else want_train[n_train++] = i;
        }
        assert_int_equal(n_eval, RECORDS * cases[c].p / cases[c].q);
        row_source d;
        assert_int_equal(row_source_open(&d, path, 2, 8, 42, cases[c].shuffle, false, cases[c].f, 1000, &err), 0);
        assert_int_equal(d.n_eval, n_eval);
        assert_int_equal(d.n_train, n_train);
        assert_int_equal(d.epoch_len, n_train / 8 * 8);
        /* held out: every one, in sample order */
        int32_t ids[2 * 2 * RECORDS], labels[2 * 2 * RECORDS];
        row_batch held = {.n = (int)n_eval, .seq_len = 2, .input_ids = ids, .labels = labels};
        row_source_fill_eval(&d, 0, &held);
        for (uint64_t i = 0; i < n_eval; i++) assert_int_equal(ids[2 * i], want_eval[i]);
        /* trained: two epochs, never a held-out sample, each epoch the first epoch_len of the
         * trained samples (in file order without shuffling, a permutation of them with) */
        int n = (int)(2 * d.epoch_len);
        row_batch trained = {.n = n, .seq_len = 2, .input_ids = ids, .labels = labels};
        row_source_fill(&d, 0, &trained);
        for (int e = 0; e < 2; e++) {
            int seen[RECORDS] = {0};
            for (uint64_t i = 0; i < d.epoch_len; i++) {
                int32_t r = ids[2 * (e * d.epoch_len + i)];
                assert_true(r >= 0 && r < RECORDS);
                assert_false(held_out((uint64_t)r, cases[c].p, cases[c].q));
                seen[r]++;
                if (!cases[c].shuffle) assert_int_equal(r, want_train[i]);
            }
            for (uint64_t i = 0; i < n_train && d.epoch_len == n_train; i++) assert_int_equal(seen[want_train[i]], 1);
        }
        row_source_close(&d);
    }
    unlink(path);
}

/* A cache of pairs (F49): a sample is records 2i, 2i+1, into rows 2j, 2j+1; shuffled as
 * pairs; an odd record count and packing refused. */
static void test_pairs(void **state) {
    (void)state;
    char path[] = "/tmp/fsdp-test-pairs-XXXXXX";
    errbuf err;
    write_records_as(path, 20, TOK_FORMAT_PAIRS); /* 10 pairs */
    row_source d;
    assert_int_equal(row_source_open(&d, path, 2, 4, 42, true, false, 0, 1000, &err), 0);
    assert_true(d.pairs);
    assert_int_equal(d.n_samples, 10);
    assert_int_equal(d.epoch_len, 8);
    int32_t ids[16 * 2], labels[16 * 2];
    row_batch rows = {.n = 16, .seq_len = 2, .input_ids = ids, .labels = labels}; /* 8 pairs */
    row_source_fill(&d, 0, &rows);
    int seen[10] = {0};
    for (int i = 0; i < 8; i++) {
        int32_t chosen = ids[4 * i], rejected = ids[4 * i + 2];
        assert_int_equal(chosen % 2, 0);
        assert_int_equal(rejected, chosen + 1);
        seen[chosen / 2]++;
    }
    for (int p = 0; p < 10; p++) assert_true(seen[p] <= 1);
    row_source_close(&d);
    assert_int_equal(row_source_open(&d, path, 2, 4, 42, true, true, 0, 1000, &err), -1);
    assert_non_null(strstr(err.msg, "packing a cache of pairs is not built yet"));
    unlink(path);
    char odd[] = "/tmp/fsdp-test-pairs-XXXXXX";
    write_records_as(odd, 21, TOK_FORMAT_PAIRS);
    assert_int_equal(row_source_open(&d, odd, 2, 4, 42, true, false, 0, 1000, &err), -1);
    assert_non_null(strstr(err.msg, "odd count of records"));
    unlink(odd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_order),
        cmocka_unit_test(test_eval_split),
        cmocka_unit_test(test_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
