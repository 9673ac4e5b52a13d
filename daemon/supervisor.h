/* supervisor: fsdpd's local workers — spawning them, the control protocol with each, the
 * job's phases, and stopping them — on one libevent loop.
 *
 * Phases: SETUP (HELLO -> CONFIG, ADDR -> PEERS once all are in, ready -> START once all
 * are ready), TRAINING (METRICS, HEARTBEAT), STOPPING (STOP sent, then SIGKILL after
 * runtime.stop_grace_s), and the functions that move between them (set_phase asserts each
 * move is one of these, in debug builds):
 *
 *            start_training                  begin_stop
 *     SETUP ----------------> TRAINING ------------------> STOPPING --> every worker exited
 *       |  (every node ready)        (a failure, a signal,    ^          (the loop ends)
 *       |                             fsdpctl stop, the end)  |
 *       +-----------------------------------------------------+
 *                 begin_stop (a failure or a stop before training)
 *
 *   The job ends when every worker has exited.  It succeeded when
 * each exited with status 0 and nothing failed; the first failure (a worker's FATAL, a
 * non-zero exit or a death by signal, missed heartbeats) stops the others and is the reason
 * fsdpd gives.  The grace of a stop is armed once: a failure seen again (a stalled rank, at
 * every heartbeat check) may bring the SIGKILL closer, never push it back.
 *
 * Checkpoints (daemon/ckpt_commit.h): before spawning, checkpoint.dir is prepared and the
 * checkpoint to resume from (checkpoint.resume) is found and checked — a bad one stops the
 * job before any worker starts; its global_batch and seed replace the job's.  During
 * training the coordinator commits the workers' saves.  A job whose workers all exited 0
 * still fails when its final checkpoint did not commit.
 *
 * Network (daemon/fabric.h): each worker's ready heartbeat says the transport its
 * collectives use and, after the network check (fabric.preflight), its bus bandwidth; both
 * are logged and in status.  The job stops before training (permanently: no restart cures
 * it) when NCCL chose TCP sockets although the probe found EFA or InfiniBand, or when a
 * rank measured less than fabric.min_busbw_gbps.
 *
 * Fault point ckpt_request=STEP (base/fault.h) requests a checkpoint (as SIGUSR1 or the
 * status socket will) once rank 0 reports step STEP. */
#ifndef FSDP_SUPERVISOR_H
#define FSDP_SUPERVISOR_H

#include "base/errbuf.h"
#include "proto/job.h"

struct cluster;

typedef struct supervisor_options {
    const job_config *job; /* validated for every node's ranks */
    int workers;             /* on this node */
    const char *worker_path; /* the fsdp-worker executable */
    struct cluster *cluster; /* the job's nodes (daemon/cluster.h): the secret, this node's
                              * index and address (where workers listen for their peers) */
    const char *fabric_kind;  /* what the fabric probe found (daemon/fabric.h): "efa", "ib", "none" */
    const char *fabric_found; /* and in words, for the status */
    const struct ckpt_data_identity *data_identity; /* the job's data (daemon/data_prepare.h) */
    /* daemon/run_report.h: filled before the model loads (the leader logs the resolved job and
     * writes job.json and run.json), and the progress from rank 0's METRICS; both NULL: none. */
    struct run_record *record;
    struct run_progress *progress;
    struct mlflow_log *mlflow;  /* runtime.log_to mlflow (daemon/mlflow_log.h): rank 0's steps; NULL: none */
    int restart;                /* fsdpd's restarts before this run */
    /* train.sample_prompts (daemon/sample_prompts.h), sent in CONFIG; rank 0's SAMPLE replies
     * go to the log and OUTPUT_DIR/samples.jsonl.  NULL: none. */
    const struct sample_prompts *samples;
    /* This node's in-memory checkpoints (daemon/memory_ckpt.h; NULL, or no images: none): the
     * workers inherit the images and save into their own; the leader resumes from them when
     * every node holds the same step (the cluster's JOINs), a follower when the leader's plan
     * says so. */
    const struct memory_images *memory;
} supervisor_options;

typedef struct supervisor supervisor;

enum {
    SUPERVISOR_OK = 0,
    SUPERVISOR_SIGNALLED = 1,           /* SIGINT */
    SUPERVISOR_PREEMPTED = 2,           /* SIGTERM, or SIGUSR1 meaning requeue (daemon/requeue.h) */
    SUPERVISOR_FAILED = -1,             /* a restart from `latest` may cure it */
    SUPERVISOR_FAILED_PERMANENTLY = -2, /* no restart can */
};

/* Runs the job to its end.  Returns SUPERVISOR_OK when it succeeded (or stopped on `fsdpctl
 * stop`), SUPERVISOR_PREEMPTED when SIGTERM stopped it (a synchronous checkpoint of the step
 * in progress, then a stop, everything killed runtime.stop_grace_s after the first SIGTERM, a
 * second one changes nothing), or SIGUSR1 where it means requeue (requeue_on_usr1: the same
 * as SIGTERM), SUPERVISOR_SIGNALLED when SIGINT stopped it (STOP, then SIGKILL after
 * stop_grace_s, a second one kills the workers at once), else a failure with the reason in err:
 * SUPERVISOR_FAILED_PERMANENTLY when no restart can cure it (the set-up before the workers
 * start — the checkpoint to resume, the model, the metrics file — failed, or the first
 * failure was a worker's FATAL marked permanent: its job, model, checkpoint or data would not
 * load), SUPERVISOR_FAILED otherwise (a worker that crashed, was killed, missed heartbeats).
 * SIGUSR1 that does not mean requeue takes a checkpoint and training goes on.  A SIGUSR1 that
 * came before the loop listened (requeue_take_early_usr1) is handled once it does. */
int supervisor_run(const supervisor_options *opt, errbuf *err);

#endif
