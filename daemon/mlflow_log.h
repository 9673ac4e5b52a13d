/* mlflow_log: runtime.log_to mlflow — one MLflow run per fsdpd launch on the leader, over the
 * tracking server's REST API (proto/mlflow.h) through libcurl (TLS included).
 *
 * At the start, in the caller's thread, each request under a short deadline: the experiment
 * runtime.mlflow_experiment found by name (created when the server has none), a run created
 * in it (named after output.dir, and the SLURM job id under SLURM), the resolved job logged as
 * its parameters ("train.lr", ...).  A server that cannot be reached, or answers with an
 * error, is a warning naming the reason, and the job trains without MLflow; with
 * runtime.log_required it is an error.
 *
 * Then a background thread sends the metrics (daemon/step_scalars.h, every step) in
 * log-batch requests.  mlflow_log_step only copies into a bounded queue (QUEUE_VALUES metric
 * values; a step that does not fit is dropped and counted), so a slow or dead server never
 * holds a step back.  A request that fails for want of the server (no connection, a timeout,
 * HTTP 429 or 5xx) is retried with backoff (0.5, 1, 2 s), then its values are dropped and
 * counted; the first drop is logged with the reason, and the totals at the end.
 *
 * mlflow_log_finish sends what is queued (for at most FINISH_S = 10 seconds, a request still in
 * flight then cut; nothing is retried), marks the run FINISHED, FAILED or KILLED (runs/update,
 * within 3 s) and logs what was sent and what was dropped: a server that accepts and never
 * answers holds the end of fsdpd back 13 s at most.  A token in MLFLOW_TRACKING_TOKEN goes in an "Authorization: Bearer"
 * header; it is never logged, nor are the answers' bodies beyond an error's code and
 * message. */
#ifndef FSDP_MLFLOW_LOG_H
#define FSDP_MLFLOW_LOG_H

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/msg.h"

typedef struct mlflow_log mlflow_log;

/* *out is NULL when the job does not log to MLflow, or when the server could not be reached
 * and runtime.log_required is false (the warning logged); -1 only under log_required. */
int mlflow_log_start(mlflow_log **out, const job_config *j, errbuf *err);
/* Queues one step's metrics (NULL m: nothing); never blocks on the network. */
void mlflow_log_step(mlflow_log *m, const msg_metrics *x);
/* status: "FINISHED", "FAILED" or "KILLED"; frees m (NULL: nothing). */
void mlflow_log_finish(mlflow_log *m, const char *status);

#endif
