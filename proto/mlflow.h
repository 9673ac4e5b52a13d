/* mlflow: the bodies of the MLflow tracking REST API (2.0, /api/2.0/mlflow/...) that fsdpd's
 * runtime.log_to mlflow sends, and strict decoders of the answers it reads.
 *
 * Requests (JSON objects; every string escaped by jansson):
 *   experiments/get-by-name   GET ?experiment_name=NAME (mlflow_query_escape)
 *   experiments/create        {"name"}
 *   runs/create               {"experiment_id", "run_name", "start_time" (ms), "tags": [{"key", "value"}]}
 *   runs/log-batch            {"run_id", "metrics": [{"key", "value", "timestamp" (ms), "step"}]}
 *                             {"run_id", "params": [{"key", "value"}]} (at most 100 a request)
 *   runs/update               {"run_id", "status" (FINISHED, FAILED, KILLED), "end_time" (ms)}
 * Answers read:
 *   get-by-name  {"experiment": {"experiment_id", "lifecycle_stage"?, ...}}
 *   create       {"experiment_id"}
 *   runs/create  {"run": {"info": {"run_id", ...}, ...}}
 *   an error     {"error_code", "message"} (any HTTP status >= 400)
 * The decoders need a JSON object of at most MLFLOW_BODY_MAX bytes, and the members they read
 * present with the right type: ids of 1 to MLFLOW_ID_MAX - 1 characters from [A-Za-z0-9_-]
 * (they go into URLs and later bodies). Members they do not read are allowed: the server
 * adds some with each version. */
#ifndef FSDP_MLFLOW_H
#define FSDP_MLFLOW_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errbuf.h"

#define MLFLOW_ID_MAX 64
#define MLFLOW_BODY_MAX (1u << 20)
#define MLFLOW_MAX_PARAMS 100   /* log-batch: params a request */
#define MLFLOW_MAX_METRICS 1000 /* log-batch: metrics a request */
#define MLFLOW_PARAM_VALUE_MAX 6000

typedef struct mlflow_metric {
    const char *key;
    double value; /* finite */
    int64_t timestamp_ms, step;
} mlflow_metric;

/* Each returns a malloc'd NUL-terminated body, or NULL with the reason. */
char *mlflow_experiment_create_body(const char *name, errbuf *err);
char *mlflow_run_create_body(const char *experiment_id, const char *run_name, int64_t start_ms, errbuf *err);
char *mlflow_metrics_body(const char *run_id, const mlflow_metric *m, size_t n, errbuf *err);
/* Params [first, first + MLFLOW_MAX_PARAMS) of job_to_object's object `job`, flattened
 * ("train.lr": its JSON text, a string as itself, cut to MLFLOW_PARAM_VALUE_MAX bytes);
 * *next: the index after the last one taken (the param count once all are taken). */
char *mlflow_params_body(const char *run_id, const json_t *job, size_t first, size_t *next, errbuf *err);
char *mlflow_run_update_body(const char *run_id, const char *status, int64_t end_ms, errbuf *err);
/* NAME escaped for a URL query (RFC 3986 unreserved kept), into out; -1 when it does not fit. */
int mlflow_query_escape(const char *name, char *out, size_t n, errbuf *err);

/* The experiment id of a get-by-name answer (a deleted experiment refused) or of a create
 * answer. */
int mlflow_parse_experiment(const char *text, size_t len, char id[MLFLOW_ID_MAX], errbuf *err);
int mlflow_parse_experiment_created(const char *text, size_t len, char id[MLFLOW_ID_MAX], errbuf *err);
/* The run id of a runs/create answer. */
int mlflow_parse_run(const char *text, size_t len, char id[MLFLOW_ID_MAX], errbuf *err);
/* An error answer as "ERROR_CODE: message" (cut to fit n), or the start of the body's printable
 * text when it is not one; never fails. */
void mlflow_error_text(const char *text, size_t len, char *out, size_t n);

#endif
