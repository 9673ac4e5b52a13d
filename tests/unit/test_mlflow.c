/* Unit tests for proto/mlflow: the request bodies (exact JSON), the job flattened into params
 * in batches of MLFLOW_MAX_PARAMS, query escaping, and the strict decoders of the answers
 * (each malformed answer refused naming the member). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "proto/mlflow.h"

static void assert_contains(const char *msg, const char *part) {
    if (!strstr(msg, part)) fail_msg("message \"%s\" lacks \"%s\"", msg, part);
}

static void assert_body(char *body, const char *want) {
    assert_non_null(body);
    assert_string_equal(body, want);
    free(body);
}

static void test_bodies(void **state) {
    (void)state;
    errbuf err;
    assert_body(mlflow_experiment_create_body("my \"exp\"", &err), "{\"name\":\"my \\\"exp\\\"\"}");
    assert_body(mlflow_run_create_body("7", "out-42", 1700000000123, &err),
                "{\"experiment_id\":\"7\",\"run_name\":\"out-42\",\"start_time\":1700000000123,"
                "\"tags\":[{\"key\":\"mlflow.source.name\",\"value\":\"fsdpd\"}]}");
    mlflow_metric m[] = {{"train/loss", 2.5, 1000, 3}, {"train/lr", 1e-4, 1001, 3}};
    assert_body(mlflow_metrics_body("r1", m, 2, &err),
                "{\"run_id\":\"r1\",\"metrics\":[{\"key\":\"train/loss\",\"value\":2.5,\"timestamp\":1000,\"step\":3},"
                "{\"key\":\"train/lr\",\"value\":0.0001,\"timestamp\":1001,\"step\":3}]}");
    mlflow_metric bad[] = {{"train/loss", NAN, 1, 1}};
    assert_null(mlflow_metrics_body("r1", bad, 1, &err));
    assert_contains(err.msg, "metric train/loss: ");
    assert_contains(err.msg, "nan is not finite");
    assert_body(mlflow_run_update_body("r1", "KILLED", 5, &err), "{\"run_id\":\"r1\",\"status\":\"KILLED\",\"end_time\":5}");

    char q[64];
    assert_int_equal(mlflow_query_escape("a b/ü&x=y_-.~", q, sizeof q, &err), 0);
    assert_string_equal(q, "a%20b%2F%C3%BC%26x%3Dy_-.~");
    assert_int_equal(mlflow_query_escape("a/b", q, 5, &err), -1);
}

/* 130 keys in two sections: two requests (100 and 30), values as their JSON text, strings as
 * themselves, and a long string cut. */
static void test_params(void **state) {
    (void)state;
    errbuf err;
    json_t *job = json_object(), *a = json_object(), *b = json_object();
    json_object_set_new(job, "train", a);
    json_object_set_new(job, "runtime", b);
    json_object_set_new(a, "lr", json_real(0.0002));
    json_object_set_new(a, "betas", json_pack("[f,f]", 0.9, 0.95));
    json_object_set_new(a, "name", json_string("x y"));
    char *big = malloc(MLFLOW_PARAM_VALUE_MAX + 100);
    memset(big, 'z', MLFLOW_PARAM_VALUE_MAX + 99);
    big[MLFLOW_PARAM_VALUE_MAX + 99] = '\0';
    json_object_set_new(a, "big", json_string(big));
    free(big);
    for (int i = 0; i < 126; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%03d", i);
        json_object_set_new(b, k, json_integer(i));
    }
    size_t next;
    char *body = mlflow_params_body("r", job, 0, &next, &err);
    assert_non_null(body);
    assert_int_equal(next, 100);
    json_t *o = json_loads(body, 0, NULL);
    free(body);
    json_t *p = json_object_get(o, "params");
    assert_int_equal(json_array_size(p), 100);
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 0), "key")), "train.lr");
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 0), "value")), "0.0002");
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 1), "value")), "[0.9,0.95]");
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 2), "value")), "x y");
    assert_int_equal(strlen(json_string_value(json_object_get(json_array_get(p, 3), "value"))), MLFLOW_PARAM_VALUE_MAX);
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 4), "key")), "runtime.k000");
    json_decref(o);
    body = mlflow_params_body("r", job, next, &next, &err);
    o = json_loads(body, 0, NULL);
    free(body);
    assert_int_equal(next, 130);
    assert_int_equal(json_array_size(json_object_get(o, "params")), 30);
    json_decref(o);
    body = mlflow_params_body("r", job, next, &next, &err);
    assert_int_equal(next, 130); /* nothing left: the caller stops */
    free(body);
    json_decref(job);
}

#define ANSWER(s) s, strlen(s)

static void test_answers(void **state) {
    (void)state;
    errbuf err;
    char id[MLFLOW_ID_MAX];
    assert_int_equal(mlflow_parse_experiment(ANSWER("{\"experiment\":{\"experiment_id\":\"12\",\"name\":\"e\","
                                                    "\"lifecycle_stage\":\"active\",\"tags\":[]}}"), id, &err), 0);
    assert_string_equal(id, "12");
    assert_int_equal(mlflow_parse_experiment_created(ANSWER("{\"experiment_id\":\"3\"}"), id, &err), 0);
    assert_string_equal(id, "3");
    assert_int_equal(mlflow_parse_run(ANSWER("{\"run\":{\"info\":{\"run_id\":\"0d69fdba4e4b486abb286501707a2883\","
                                             "\"status\":\"RUNNING\"},\"data\":{}}}"), id, &err), 0);
    assert_string_equal(id, "0d69fdba4e4b486abb286501707a2883");

    static const struct {
        int which; /* 0 get-by-name, 1 create, 2 runs/create */
        const char *text, *part;
    } bad[] = {
        {0, "", "experiments/get-by-name: the answer is not JSON"},
        {0, "[]", "the answer is a list, not an object"},
        {0, "{}", "experiments/get-by-name: experiment: missing"},
        {0, "{\"experiment\":[]}", "experiment: expected an object, got a list"},
        {0, "{\"experiment\":{}}", "experiment.experiment_id: missing"},
        {0, "{\"experiment\":{\"experiment_id\":12}}", "experiment.experiment_id: expected a string, got an integer"},
        {0, "{\"experiment\":{\"experiment_id\":\"\"}}", "experiment.experiment_id: 0 characters"},
        {0, "{\"experiment\":{\"experiment_id\":\"1/../2\"}}", "character 1 is not a letter, digit"},
        {0, "{\"experiment\":{\"experiment_id\":\"1\",\"lifecycle_stage\":\"deleted\"}}", "experiment 1 is deleted"},
        {0, "{\"experiment\":{\"experiment_id\":\"1\",\"lifecycle_stage\":3}}", "lifecycle_stage: expected a string"},
        {0, "{\"experiment\":{\"experiment_id\":\"1\"},\"experiment\":{}}", "not JSON"}, /* duplicate keys */
        {1, "{\"experiment_id\":null}", "experiments/create: experiment_id: expected a string, got null"},
        {1, "{\"experiment_id\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", "64 characters (1 to 63)"},
        {2, "{\"run\":{}}", "runs/create: run.info: missing"},
        {2, "{\"run\":{\"info\":{\"run_uuid\":\"x\"}}}", "runs/create: run.info.run_id: missing"},
        {2, "{\"run\":{\"info\":{\"run_id\":\"a\\u0000b\"}}}", "runs/create: the answer is not JSON"},
        {2, "{\"run\":{\"info\":{\"run_id\":\"a b\"}}}", "run.info.run_id: character 1 is not"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = strlen(bad[i].text);
        int rc = bad[i].which == 0   ? mlflow_parse_experiment(bad[i].text, n, id, &err)
                 : bad[i].which == 1 ? mlflow_parse_experiment_created(bad[i].text, n, id, &err)
                                     : mlflow_parse_run(bad[i].text, n, id, &err);
        if (rc == 0) fail_msg("accepted: %s", bad[i].text);
        assert_contains(err.msg, bad[i].part);
    }

    char why[64];
    mlflow_error_text(ANSWER("{\"error_code\":\"RESOURCE_DOES_NOT_EXIST\",\"message\":\"no such\\nthing\"}"), why, sizeof why);
    assert_string_equal(why, "RESOURCE_DOES_NOT_EXIST: no such?thing");
    mlflow_error_text(ANSWER("<html>Bad Gateway</html>"), why, sizeof why);
    assert_string_equal(why, "<html>Bad Gateway</html>");
    mlflow_error_text(ANSWER(""), why, sizeof why);
    assert_string_equal(why, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_params),
        cmocka_unit_test(test_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
