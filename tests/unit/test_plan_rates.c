/* proto/plan_rates: the committed H200 table parses with its values; a small table parses;
 * every malformed table is refused with a message naming the file and the key, and leaves
 * nothing allocated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/plan_rates.h"

#define H200 "configs/plan/h200.json"

/* A valid table with one row more than the minimum in each list (rows [0] and [1]). */
static const char valid[] =
    "{\"format\": \"fsdpd-plan-rates/1\", \"gpu\": \"h200\", \"device\": \"NVIDIA H200\",\n"
    " \"context_bytes\": 590151680, \"elementwise_gbps\": 3291.9, \"dequant_gbps\": 2224.8,\n"
    " \"cross_entropy_gbps\": 2124.8, \"adamw_gbps\": 3844.9, \"h2d_gbps\": 55.4,\n"
    " \"d2h_gbps\": 55.4, \"registered_h2d_gbps\": 24.5, \"launch_us\": 0.87, \"host_adamw_gelems\": 1.604, \"disk_gbps\": 1.472,\n"
    " \"gemm\": [[2048, 2048, 2048, 0.0431, 0.0426, 0.0467], [4096, 64, 256, 0.0264, 0.024, 0.0261]],\n"
    " \"attention\": [[1, 2048, 32, 4, 64, 0.1046, 0.8406], [2, 4096, 64, 8, 128, 2.29, 7.86]]}\n";

static void assert_empty(const plan_rates *r) {
    assert_null(r->gemm);
    assert_null(r->attention);
    assert_int_equal(r->n_gemm, 0);
    assert_int_equal(r->n_attention, 0);
    assert_string_equal(r->gpu, "");
}

static void test_h200_table(void **state) {
    (void)state;
    plan_rates r;
    errbuf err = {{0}};
    if (plan_rates_load(&r, H200, &err)) fail_msg("%s", err.msg);
    assert_string_equal(r.gpu, "h200");
    assert_string_equal(r.device, "NVIDIA H200");
    assert_true(r.context_bytes == 590151680.0);
    assert_true(r.elementwise_gbps == 3189.1);
    assert_true(r.h2d_gbps == 55.3);
    assert_true(r.registered_h2d_gbps == 55.4);
    assert_true(r.launch_us == 1.12);
    assert_true(r.host_adamw_gelems == 3.145);
    assert_true(r.disk_gbps == 1.393);
    assert_int_equal(r.n_gemm, 124);
    assert_int_equal(r.n_attention, 44);
    const plan_gemm_rate *g0 = &r.gemm[0], *gl = &r.gemm[r.n_gemm - 1];
    assert_int_equal(g0->N, 2048);
    assert_int_equal(g0->I, 2048);
    assert_int_equal(g0->O, 2048);
    assert_true(g0->fwd_ms == 0.0475 && g0->dx_ms == 0.0487 && g0->dw_ms == 0.0497);
    assert_int_equal(gl->N, 16384);
    assert_int_equal(gl->I, 28672);
    assert_int_equal(gl->O, 64);
    assert_true(gl->dw_ms == 0.2439);
    const plan_attention_rate *a = &r.attention[r.n_attention - 1];
    assert_int_equal(a->B, 1); /* the long rows (plan_rates' measure_long_attention) */
    assert_int_equal(a->T, 65536);
    assert_int_equal(a->Hq, 64);
    assert_int_equal(a->Hkv, 8);
    assert_int_equal(a->hd, 128);
    assert_true(a->fwd_ms == 104.813 && a->bwd_ms == 380.3999);
    plan_rates_free(&r);
    assert_empty(&r);
    plan_rates_free(&r); /* freeing a freed (zeroed) table is harmless */
}

static void test_small_table(void **state) {
    (void)state;
    plan_rates r;
    errbuf err = {{0}};
    if (plan_rates_parse(&r, valid, strlen(valid), "small.json", &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.n_gemm, 2);
    assert_int_equal(r.n_attention, 2);
    assert_int_equal(r.gemm[1].I, 64);
    assert_true(r.gemm[1].dx_ms == 0.024);
    assert_int_equal(r.attention[0].Hkv, 4);
    assert_true(r.attention[1].bwd_ms == 7.86);
    plan_rates_free(&r);
    assert_empty(&r);
}

/* valid with the first `find` replaced by `replace` (the whole text when find is NULL). */
static char *edited(const char *find, const char *replace) {
    if (!find) return strdup(replace);
    const char *at = strstr(valid, find);
    if (!at) fail_msg("\"%s\" is not in the valid table", find);
    size_t head = (size_t)(at - valid), n = strlen(valid) - strlen(find) + strlen(replace);
    char *text = malloc(n + 1);
    assert_non_null(text);
    memcpy(text, valid, head);
    strcpy(text + head, replace);
    strcat(text, at + strlen(find));
    return text;
}

static const struct bad_case {
    const char *find, *replace, *expect;
} bad_cases[] = {
    {"\"launch_us\": 0.87, ", "", "bad.json: launch_us: missing"},
    {"\"gemm\": [[2048, 2048, 2048, 0.0431, 0.0426, 0.0467], [4096, 64, 256, 0.0264, 0.024, 0.0261]],",
     "", "bad.json: gemm: missing"},
    {"\"device\": \"NVIDIA H200\",", "", "bad.json: device: missing"},
    {"\"gpu\"", "\"extra\": 1, \"gpu\"", "bad.json: unknown key \"extra\""},
    {"\"launch_us\"", "\"launch_ms\"", "bad.json: unknown key \"launch_ms\""},
    {"\"gpu\": \"h200\",", "\"gpu\": \"h200\", \"gpu\": \"h100\",", "duplicate object key"},
    {"fsdpd-plan-rates/1", "fsdpd-plan-rates/2",
     "bad.json: format: \"fsdpd-plan-rates/2\", expected \"fsdpd-plan-rates/1\""},
    {"\"fsdpd-plan-rates/1\"", "1", "bad.json: format: 1, expected \"fsdpd-plan-rates/1\""},
    /* jansson refuses what would not be finite: overflow, NaN, Infinity */
    {"0.87", "1e999", "bad.json: line 4: real number overflow"},
    {"0.87", "NaN", "bad.json: line 4: invalid token"},
    {"0.87", "Infinity", "bad.json: line 4: invalid token"},
    {"0.87", "-0.87", "bad.json: launch_us: expected a finite positive number, got -0.87"},
    {"1.472", "0", "bad.json: disk_gbps: expected a finite positive number, got 0"},
    {"1.472", "0.0", "bad.json: disk_gbps: expected a finite positive number, got 0.0"},
    {"590151680", "\"590151680\"", "bad.json: context_bytes: expected a finite positive number, got a string"},
    {"55.4", "null", "bad.json: h2d_gbps: expected a finite positive number, got null"},
    {"0.0426", "0", "bad.json: gemm[0][4]: expected a finite positive number, got 0"},
    {"0.8406", "-1e-3", "bad.json: attention[0][6]: expected a finite positive number, got -0.001"},
    {"0.0431, ", "", "bad.json: gemm[0]: 5 values, expected 6 [N, I, O, fwd_ms, dx_ms, dw_ms]"},
    {"0.8406]", "0.8406, 1]", "bad.json: attention[0]: 8 values, expected 7 [B, T, Hq, Hkv, hd, fwd_ms, bwd_ms]"},
    {"[4096, 64, 256, 0.0264, 0.024, 0.0261]", "4096",
     "bad.json: gemm[1]: expected a list of 6 values [N, I, O, fwd_ms, dx_ms, dw_ms], got an integer"},
    {"[4096, 64,", "[4096, 64.5,", "bad.json: gemm[1][1]: expected a positive integer below 2^31, got 64.5"},
    {"[4096, 64,", "[4096, 64.0,", "bad.json: gemm[1][1]: expected a positive integer below 2^31, got 64.0"},
    {"[4096, 64,", "[4096, \"64\",", "bad.json: gemm[1][1]: expected a positive integer below 2^31, got a string"},
    {"[4096, 64,", "[2147483648, 64,", "bad.json: gemm[1][0]: expected a positive integer below 2^31, got 2147483648"},
    {"[4096, 64,", "[99999999999999999999, 64,", "bad.json: line 5: too big integer"},
    {"[1, 2048,", "[0, 2048,", "bad.json: attention[0][0]: expected a positive integer below 2^31, got 0"},
    {"[1, 2048,", "[1, -2048,", "bad.json: attention[0][1]: expected a positive integer below 2^31, got -2048"},
    {"32, 4, 64", "30, 4, 64", "bad.json: attention[0]: Hq 30 is not a multiple of Hkv 4"},
    {"32, 4, 64", "4, 32, 64", "bad.json: attention[0]: Hq 4 is not a multiple of Hkv 32"},
    {"\"gemm\": [[2048, 2048, 2048, 0.0431, 0.0426, 0.0467], [4096, 64, 256, 0.0264, 0.024, 0.0261]]",
     "\"gemm\": []", "bad.json: gemm: 0 rows, expected 1 to 4096"},
    {"\"attention\": [[1, 2048, 32, 4, 64, 0.1046, 0.8406], [2, 4096, 64, 8, 128, 2.29, 7.86]]",
     "\"attention\": []", "bad.json: attention: 0 rows, expected 1 to 4096"},
    {"\"attention\": [[1, 2048, 32, 4, 64, 0.1046, 0.8406], [2, 4096, 64, 8, 128, 2.29, 7.86]]",
     "\"attention\": {}", "bad.json: attention: expected a list of rows [B, T, Hq, Hkv, hd, fwd_ms, bwd_ms], got an object"},
    {NULL, "{\"format\": ", "bad.json: line 1: "},
    {NULL, "", "bad.json: line 1: "},
    {NULL, "not json", "bad.json: line 1: '[' or '{' expected near 'not'"},
    {NULL, "[1, 2]", "bad.json: a list, expected an object"},
    {NULL, "\"fsdpd-plan-rates/1\"", "bad.json: line 1: '[' or '{' expected"},
    {NULL, "{}", "bad.json: context_bytes: missing"},
    {"\"h200\"", "\"h200-with-a-name-of-sixty-four-characters-which-is-one-too-many!\"",
     "bad.json: gpu: 64 characters, expected 1 to 63"},
    {"\"NVIDIA H200\"", "\"\"", "bad.json: device: 0 characters, expected 1 to 63"},
    {"\"NVIDIA H200\"", "[\"NVIDIA H200\"]", "bad.json: device: expected a string, got a list"},
};

static void test_bad_tables(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *c = &bad_cases[i];
        char *text = edited(c->find, c->replace);
        plan_rates r;
        errbuf err = {{0}};
        int rc = plan_rates_parse(&r, text, strlen(text), "bad.json", &err);
        if (rc == 0 || !strstr(err.msg, c->expect))
            fail_msg("case %zu (%s -> %s): rc %d, message \"%s\", expected \"%s\"", i,
                     c->find ? c->find : "(all)", c->replace, rc, err.msg, c->expect);
        assert_empty(&r);
        plan_rates_free(&r); /* after a failed parse: nothing to free, still harmless */
        free(text);
    }
}

/* 63 characters is the longest name (the array holds its NUL). */
static void test_longest_name(void **state) {
    (void)state;
    const char *name63 = "\"h200-with-a-name-of-sixty-three-characters-which-is-just-right!\"";
    assert_int_equal(strlen(name63), 63 + 2);
    char *text = edited("\"h200\"", name63);
    plan_rates r;
    errbuf err = {{0}};
    if (plan_rates_parse(&r, text, strlen(text), "long.json", &err)) fail_msg("%s", err.msg);
    assert_int_equal(strlen(r.gpu), 63);
    plan_rates_free(&r);
    free(text);
}

/* A table of n gemm rows (each the same). */
static char *table_of_rows(int n) {
    static const char row[] = "[64, 64, 64, 0.01, 0.01, 0.01],";
    char *rows = malloc((size_t)n * (sizeof row - 1) + 1), *p = rows;
    assert_non_null(rows);
    for (int i = 0; i < n; i++) p += sprintf(p, "%s", row);
    if (n) p[-1] = 0; /* no trailing comma */
    else *p = 0;
    size_t len = strlen(rows) + 8;
    char *list = malloc(len);
    assert_non_null(list);
    snprintf(list, len, "[%s]", rows);
    free(rows);
    char *text = edited("[[2048, 2048, 2048, 0.0431, 0.0426, 0.0467], [4096, 64, 256, 0.0264, 0.024, 0.0261]]", list);
    free(list);
    return text;
}

static void test_row_limit(void **state) {
    (void)state;
    plan_rates r;
    errbuf err = {{0}};
    char *text = table_of_rows(PLAN_RATES_MAX_ROWS);
    if (plan_rates_parse(&r, text, strlen(text), "max.json", &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.n_gemm, PLAN_RATES_MAX_ROWS);
    assert_int_equal(r.gemm[PLAN_RATES_MAX_ROWS - 1].O, 64);
    plan_rates_free(&r);
    free(text);
    text = table_of_rows(PLAN_RATES_MAX_ROWS + 1);
    assert_int_equal(plan_rates_parse(&r, text, strlen(text), "over.json", &err), -1);
    assert_string_equal(err.msg, "over.json: gemm: 4097 rows, expected 1 to 4096");
    assert_empty(&r);
    free(text);
}

static void test_load_errors(void **state) {
    (void)state;
    plan_rates r;
    errbuf err = {{0}};
    assert_int_equal(plan_rates_load(&r, "/nonexistent/rates.json", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/rates.json"));
    assert_empty(&r);
    assert_int_equal(plan_rates_load(&r, "configs/plan", &err), -1);
    assert_non_null(strstr(err.msg, "configs/plan"));
    assert_empty(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_h200_table),
        cmocka_unit_test(test_small_table),
        cmocka_unit_test(test_bad_tables),
        cmocka_unit_test(test_longest_name),
        cmocka_unit_test(test_row_limit),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
