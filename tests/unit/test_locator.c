/* daemon/locator: the ranks a hung collective waits for, from status rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/locator.h"

static json_t *row(int rank, int node, long long started, long long finished, const char *op, int unit, double still) {
    return json_pack("{s:i, s:i, s:{s:I, s:I, s:s, s:i}, s:f}", "rank", rank, "node", node, "coll", "started",
                     (json_int_t)started, "finished", (json_int_t)finished, "op", op, "unit", unit, "coll_still_s",
                     still);
}

static const char *line(const json_t *found, size_t i) { return json_string_value(json_array_get(found, i)); }

static void test_names_the_rank_behind(void **state) {
    (void)state;
    json_t *ranks = json_pack("[o, o, o]", row(0, 0, 4821, 4820, "all_gather", 17, 30),
                              row(13, 2, 4820, 4820, "reduce_scatter", 16, 30), row(2, 1, 4821, 4820, "all_gather", 17, 30));
    json_t *nodes = json_pack("[{s:i, s:s}, {s:i, s:s}, {s:i, s:s}]", "node", 0, "host", "10.0.0.1", "node", 1, "host",
                              "10.0.0.2", "node", 2, "host", "10.0.0.3");
    json_t *found = locator_find(ranks, nodes, 2);
    assert_int_equal(json_array_size(found), 1);
    assert_string_equal(line(found, 0), "rank 13 on node 2 (10.0.0.3) never started all_gather #4821 of unit 17; its "
                                        "last was reduce_scatter #4820");
    json_decref(found);
    found = locator_find(ranks, NULL, 2); /* no hosts: the node alone */
    assert_string_equal(line(found, 0), "rank 13 on node 2 never started all_gather #4821 of unit 17; its last was "
                                        "reduce_scatter #4820");
    json_decref(found);
    json_decref(ranks);
    json_decref(nodes);
}

static void test_moving_figures_say_nothing(void **state) {
    (void)state;
    /* rank 1 is behind, but rank 0's figures moved 0.5 s ago: the job was not hung */
    json_t *ranks = json_pack("[o, o]", row(0, 0, 10, 9, "all_reduce", -1, 0.5), row(1, 0, 9, 9, "all_gather", 3, 30));
    json_t *found = locator_find(ranks, NULL, 2);
    assert_int_equal(json_array_size(found), 0);
    json_decref(found);
    json_decref(ranks);
}

static void test_every_rank_inside(void **state) {
    (void)state;
    /* all started #10 (no unit); rank 1 finished it, rank 0 did not */
    json_t *ranks = json_pack("[o, o, {s:i, s:i}]", row(0, 0, 10, 9, "all_reduce", -1, 9),
                              row(1, 0, 10, 10, "all_reduce", -1, 9), "rank", 2, "node", 0);
    json_t *found = locator_find(ranks, NULL, 2);
    assert_int_equal(json_array_size(found), 1);
    assert_string_equal(line(found, 0), "rank 0 on node 0 started all_reduce #10 and never finished it");
    json_decref(found);
    json_decref(ranks);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_the_rank_behind),
        cmocka_unit_test(test_moving_figures_say_nothing),
        cmocka_unit_test(test_every_rank_inside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
