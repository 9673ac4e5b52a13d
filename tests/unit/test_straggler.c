/* daemon/straggler: the ranks that hold the others back, from their status rows' step times. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/straggler.h"

/* Each rank's sums so far: advance() adds `steps` steps of the given per-step figures. */
typedef struct sums {
    long long steps;
    double step_s, comm_s, data_s;
} sums;

static void advance(sums *s, int steps, double step, double comm, double data) {
    s->steps += steps;
    s->step_s += steps * step;
    s->comm_s += steps * comm;
    s->data_s += steps * data;
}

static json_t *rows(const sums *s, int n, int per_node) {
    json_t *a = json_array();
    for (int r = 0; r < n; r++)
        json_array_append_new(a, json_pack("{s:i, s:i, s:{s:I, s:f, s:f, s:f}}", "rank", r, "node", r / per_node,
                                           "timing", "steps", (json_int_t)s[r].steps, "step_s", s[r].step_s,
                                           "comm_s", s[r].comm_s, "data_s", s[r].data_s));
    return a;
}

/* One look at the ranks' sums: the news, as one string ("" when none; lines joined by '|'). */
static const char *look(straggler_watch *w, const sums *s, int n, int per_node) {
    static char out[4096];
    json_t *r = rows(s, n, per_node);
    json_t *news = straggler_watch_look(w, r);
    assert_non_null(news);
    out[0] = '\0';
    size_t i;
    json_t *line;
    json_array_foreach(news, i, line) {
        if (i) strcat(out, "|");
        strncat(out, json_string_value(line), sizeof out - strlen(out) - 2);
    }
    json_decref(news);
    json_decref(r);
    return out;
}

/* Every rank takes one second a step; `slow` spends `own` of it outside collectives, the
 * others 0.1 (the rest waiting for it). */
static void step_all(sums *s, int n, int steps, int slow, double own, double slow_data) {
    for (int r = 0; r < n; r++)
        if (r == slow) advance(&s[r], steps, 1.0, 1.0 - own, slow_data);
        else advance(&s[r], steps, 1.0, 0.9, 0.0);
}

static void test_names_a_slow_rank_after_its_steps(void **state) {
    (void)state;
    straggler_watch *w = straggler_watch_new(1.5, 10);
    sums s[4] = {{0}};
    step_all(s, 4, 1, -1, 0, 0);
    assert_string_equal(look(w, s, 4, 2), ""); /* the first look only sets the baseline */
    step_all(s, 4, 6, 3, 0.6, 0.01);
    assert_string_equal(look(w, s, 4, 2), ""); /* slow for 6 steps: not yet 10 */
    step_all(s, 4, 6, 3, 0.6, 0.01);
    assert_string_equal(look(w, s, 4, 2),
                        "rank 3 on node 1 is a straggler: 0.600 s a step of its own (compute 0.590 s, data 0.010 s) "
                        "against the other ranks' median 0.100 s, 1.000 s a step in all, for 12 steps "
                        "(runtime.straggler_factor 1.5): phase compute");
    json_t *st = straggler_watch_status(w);
    assert_int_equal(json_array_size(st), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(st, 0), "rank")), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(st, 0), "phase")), "compute");
    json_decref(st);
    step_all(s, 4, 5, 3, 0.6, 0.01);
    assert_string_equal(look(w, s, 4, 2), ""); /* still one: said once */
    step_all(s, 4, 5, -1, 0, 0);
    assert_string_equal(look(w, s, 4, 2), "rank 3 on node 1 is no longer a straggler: 0.100 s a step of its own "
                                          "against the other ranks' median 0.100 s");
    st = straggler_watch_status(w);
    assert_int_equal(json_array_size(st), 0);
    json_decref(st);
    straggler_watch_free(w);
}

static void test_slow_in_a_row(void **state) {
    (void)state;
    straggler_watch *w = straggler_watch_new(1.5, 10);
    sums s[3] = {{0}};
    step_all(s, 3, 1, -1, 0, 0);
    look(w, s, 3, 1);
    for (int i = 0; i < 4; i++) { /* slow 6 steps, then fast: never 10 in a row */
        step_all(s, 3, 6, 1, 0.6, 0);
        assert_string_equal(look(w, s, 3, 1), "");
        step_all(s, 3, 1, -1, 0, 0);
        assert_string_equal(look(w, s, 3, 1), "");
    }
    straggler_watch_free(w);
}

static void test_phases(void **state) {
    (void)state;
    straggler_watch *w = straggler_watch_new(1.5, 2);
    sums s[3] = {{0}};
    step_all(s, 3, 1, -1, 0, 0);
    look(w, s, 3, 1);
    step_all(s, 3, 4, 0, 0.5, 0.45); /* its own time spent filling batches */
    const char *news = look(w, s, 3, 1);
    assert_non_null(strstr(news, "rank 0 on node 0 is a straggler"));
    assert_non_null(strstr(news, "(compute 0.050 s, data 0.450 s)"));
    assert_non_null(strstr(news, "phase data"));
    straggler_watch_free(w);

    /* the same own time everywhere, one rank 3x as long in collectives (its link) */
    w = straggler_watch_new(1.5, 2);
    sums c[3] = {{0}};
    for (int r = 0; r < 3; r++) advance(&c[r], 1, 1.0, 0.2, 0);
    look(w, c, 3, 1);
    for (int r = 0; r < 3; r++) advance(&c[r], 4, r == 2 ? 1.5 : 1.0, r == 2 ? 0.6 : 0.2, 0);
    news = look(w, c, 3, 1);
    assert_non_null(strstr(news, "rank 2 on node 2 is a straggler: 0.600 s a step in collectives against the other ranks' "
                                 "median 0.200 s"));
    assert_non_null(strstr(news, "phase collective"));
    straggler_watch_free(w);
}

/* Two ranks: the waiting one spends its step in collectives, which is the slow one's doing,
 * not its link's; and the median of both (their mean) would hide the slow one at factor 2. */
static void test_two_ranks(void **state) {
    (void)state;
    straggler_watch *w = straggler_watch_new(2.0, 2);
    sums s[2] = {{0}};
    step_all(s, 2, 1, -1, 0, 0);
    look(w, s, 2, 1);
    step_all(s, 2, 4, 1, 0.95, 0);
    assert_string_equal(look(w, s, 2, 1), "rank 1 on node 1 is a straggler: 0.950 s a step of its own (compute 0.950 s, "
                                          "data 0.000 s) against the other ranks' median 0.100 s, 1.000 s a step in "
                                          "all, for 4 steps (runtime.straggler_factor 2): phase compute");
    straggler_watch_free(w);
}

static void test_noise_and_new_runs(void **state) {
    (void)state;
    straggler_watch *w = straggler_watch_new(1.5, 1);
    sums s[3] = {{0}};
    step_all(s, 3, 1, -1, 0, 0);
    look(w, s, 3, 1);
    /* 3x the median's own time, but 20 ms of a 1 s step: below the 5% that counts */
    for (int r = 0; r < 3; r++) advance(&s[r], 5, 1.0, r == 1 ? 0.97 : 0.99, 0);
    assert_string_equal(look(w, s, 3, 1), "");
    /* a new run: the sums start again from 0 (no negative steps), judged from its next look */
    sums fresh[3] = {{0}};
    step_all(fresh, 3, 1, 2, 0.8, 0);
    assert_string_equal(look(w, fresh, 3, 1), "");
    step_all(fresh, 3, 2, 2, 0.8, 0);
    assert_non_null(strstr(look(w, fresh, 3, 1), "rank 2 on node 2 is a straggler"));
    /* one rank has nobody to be compared with */
    straggler_watch_free(w);
    w = straggler_watch_new(1.5, 1);
    sums one[1] = {{0}};
    advance(&one[0], 1, 1, 0, 0);
    look(w, one, 1, 1);
    advance(&one[0], 5, 1, 0, 0);
    assert_string_equal(look(w, one, 1, 1), "");
    straggler_watch_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_a_slow_rank_after_its_steps),
        cmocka_unit_test(test_slow_in_a_row),
        cmocka_unit_test(test_phases),
        cmocka_unit_test(test_two_ranks),
        cmocka_unit_test(test_noise_and_new_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
