/* mlflow: MLflow tracking REST bodies and answers; see mlflow.h. */
#include "proto/mlflow.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/json_kind.h"

static char *dump(json_t *o, errbuf *err) {
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) errf(err, "out of memory (or text that is not UTF-8) building an MLflow request");
    return text;
}

char *mlflow_experiment_create_body(const char *name, errbuf *err) {
    return dump(json_pack("{s:s}", "name", name), err);
}

char *mlflow_run_create_body(const char *experiment_id, const char *run_name, int64_t start_ms, errbuf *err) {
    return dump(json_pack("{s:s, s:s, s:I, s:[{s:s, s:s}]}", "experiment_id", experiment_id, "run_name", run_name,
                          "start_time", (json_int_t)start_ms, "tags", "key", "mlflow.source.name", "value", "fsdpd"),
                err);
}

char *mlflow_metrics_body(const char *run_id, const mlflow_metric *m, size_t n, errbuf *err) {
    if (n > MLFLOW_MAX_METRICS) return errf(err, "%zu metrics in one request (at most %d)", n, MLFLOW_MAX_METRICS), NULL;
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++) {
        if (!isfinite(m[i].value)) {
            json_decref(list);
            return errf(err, "metric %s: %g is not finite (JSON cannot carry it)", m[i].key, m[i].value), NULL;
        }
        if (json_array_append_new(list, json_pack("{s:s, s:f, s:I, s:I}", "key", m[i].key, "value", m[i].value,
                                                  "timestamp", (json_int_t)m[i].timestamp_ms, "step",
                                                  (json_int_t)m[i].step))) {
            json_decref(list);
            list = NULL;
        }
    }
    return dump(list ? json_pack("{s:s, s:o}", "run_id", run_id, "metrics", list) : NULL, err);
}

/* v's JSON text with the fewest digits (15 to 17) that read back to the same numbers: "0.0002",
 * not jansson's "0.00020000000000000001". */
static char *value_text(const json_t *v) {
    for (int digits = 15;; digits++) {
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(digits));
        json_t *back = text && digits < 17 ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
        int same = back && json_equal(back, (json_t *)v);
        json_decref(back);
        if (same || !text || digits == 17) return text;
        free(text);
    }
}

/* One flattened param: "section.key" and the value's text. */
static json_t *param(const char *section, const char *key, const json_t *v) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", section, key);
    char *text = json_is_string(v) ? strdup(json_string_value(v)) : value_text(v);
    if (!text) return NULL;
    if (strlen(text) > MLFLOW_PARAM_VALUE_MAX) { /* cut at a UTF-8 character's start */
        size_t k = MLFLOW_PARAM_VALUE_MAX;
        while (k > 0 && ((unsigned char)text[k] & 0xc0) == 0x80) k--;
        text[k] = '\0';
    }
    json_t *p = json_pack("{s:s, s:s}", "key", name, "value", text);
    free(text);
    return p;
}

char *mlflow_params_body(const char *run_id, const json_t *job, size_t first, size_t *next, errbuf *err) {
    json_t *list = json_array();
    size_t i = 0;
    const char *sname, *kname;
    json_t *section, *v;
    json_object_foreach((json_t *)job, sname, section) {
        json_object_foreach(section, kname, v) {
            if (list && i >= first && i < first + MLFLOW_MAX_PARAMS && json_array_append_new(list, param(sname, kname, v))) {
                json_decref(list);
                list = NULL;
            }
            i++;
        }
    }
    *next = i < first + MLFLOW_MAX_PARAMS ? i : first + MLFLOW_MAX_PARAMS;
    return dump(list ? json_pack("{s:s, s:o}", "run_id", run_id, "params", list) : NULL, err);
}

char *mlflow_run_update_body(const char *run_id, const char *status, int64_t end_ms, errbuf *err) {
    return dump(json_pack("{s:s, s:s, s:I}", "run_id", run_id, "status", status, "end_time", (json_int_t)end_ms), err);
}

int mlflow_query_escape(const char *name, char *out, size_t n, errbuf *err) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        int plain = isalnum(*p) || strchr("-._~", *p);
        if (o + (plain ? 1 : 3) >= n) return errf(err, "'%s': too long for a URL", name);
        if (plain) out[o++] = (char)*p;
        else o += (size_t)snprintf(out + o, n - o, "%%%02X", *p);
    }
    out[o] = '\0';
    return 0;
}

/* ---- answers ---- */

static json_t *parse_object(const char *text, size_t len, const char *what, errbuf *err) {
    if (len > MLFLOW_BODY_MAX) return errf(err, "%s: the answer is %zu bytes (at most %u)", what, len, MLFLOW_BODY_MAX), NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errf(err, "%s: the answer is not JSON: %s", what, je.text), NULL;
    if (!json_is_object(root)) {
        errf(err, "%s: the answer is %s, not an object", what, json_kind(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

/* obj.member, an object; NULL with the reason naming `path`. */
static const json_t *member_object(const json_t *obj, const char *member, const char *path, errbuf *err) {
    const json_t *v = json_object_get(obj, member);
    if (!v) return errf(err, "%s: missing", path), NULL;
    if (!json_is_object(v)) return errf(err, "%s: expected an object, got %s", path, json_kind(v)), NULL;
    return v;
}

static int read_id(const json_t *obj, const char *member, const char *path, char id[MLFLOW_ID_MAX], errbuf *err) {
    const json_t *v = json_object_get(obj, member);
    if (!v) return errf(err, "%s: missing", path);
    if (!json_is_string(v)) return errf(err, "%s: expected a string, got %s", path, json_kind(v));
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n >= MLFLOW_ID_MAX) return errf(err, "%s: %zu characters (1 to %d)", path, n, MLFLOW_ID_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_')
            return errf(err, "%s: character %zu is not a letter, digit, '-' or '_'", path, i);
    memcpy(id, s, n + 1);
    return 0;
}

int mlflow_parse_experiment(const char *text, size_t len, char id[MLFLOW_ID_MAX], errbuf *err) {
    json_t *root = parse_object(text, len, "experiments/get-by-name", err);
    if (!root) return -1;
    const json_t *e = member_object(root, "experiment", "experiments/get-by-name: experiment", err);
    int rc = e ? read_id(e, "experiment_id", "experiments/get-by-name: experiment.experiment_id", id, err) : -1;
    const json_t *stage = e ? json_object_get(e, "lifecycle_stage") : NULL;
    if (rc == 0 && stage && !json_is_string(stage))
        rc = errf(err, "experiments/get-by-name: experiment.lifecycle_stage: expected a string, got %s", json_kind(stage));
    else if (rc == 0 && stage && strcmp(json_string_value(stage), "active") != 0)
        rc = errf(err, "experiment %s is %s (restore it, or name another runtime.mlflow_experiment)", id,
                  json_string_value(stage));
    json_decref(root);
    return rc;
}

int mlflow_parse_experiment_created(const char *text, size_t len, char id[MLFLOW_ID_MAX], errbuf *err) {
    json_t *root = parse_object(text, len, "experiments/create", err);
    if (!root) return -1;
    int rc = read_id(root, "experiment_id", "experiments/create: experiment_id", id, err);
    json_decref(root);
    return rc;
}

int mlflow_parse_run(const char *text, size_t len, char id[MLFLOW_ID_MAX], errbuf *err) {
    json_t *root = parse_object(text, len, "runs/create", err);
    if (!root) return -1;
    const json_t *run = member_object(root, "run", "runs/create: run", err);
    const json_t *info = run ? member_object(run, "info", "runs/create: run.info", err) : NULL;
    int rc = info ? read_id(info, "run_id", "runs/create: run.info.run_id", id, err) : -1;
    json_decref(root);
    return rc;
}

/* The first printable bytes of s into out (others as '?'). */
static void printable(const char *s, size_t len, char *out, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < n; i++) out[o++] = isprint((unsigned char)s[i]) ? s[i] : '?';
    out[o] = '\0';
}

void mlflow_error_text(const char *text, size_t len, char *out, size_t n) {
    if (n == 0) return;
    json_t *root = len <= MLFLOW_BODY_MAX ? json_loadb(text, len, 0, NULL) : NULL;
    const json_t *code = json_object_get(root, "error_code"), *msg = json_object_get(root, "message");
    if (json_is_string(code) && json_is_string(msg)) {
        char both[1024];
        int k = snprintf(both, sizeof both, "%s: %s", json_string_value(code), json_string_value(msg));
        printable(both, k < 0 ? 0 : (size_t)k < sizeof both ? (size_t)k : sizeof both - 1, out, n);
    } else {
        printable(text, len, out, n < 201 ? n : 201);
    }
    json_decref(root);
}
