/* supervisor: fsdpd's local workers — spawning them, the control protocol with each, the
 * job's phases, and stopping them — on one libevent loop.
 *
 * Phases: SETUP (HELLO -> CONFIG, ADDR -> PEERS once all are in, ready -> START once all
 * are ready), TRAINING (METRICS, HEARTBEAT), STOPPING (STOP sent, then SIGKILL after
 * runtime.stop_grace_s).  The job ends when every worker has exited.  It succeeded when
 * each exited with status 0 and nothing failed; the first failure (a worker's FATAL, a
 * non-zero exit or a death by signal, missed heartbeats, a signal to fsdpd) stops the
 * others and is the reason fsdpd gives. */
#ifndef FSDP_SUPERVISOR_H
#define FSDP_SUPERVISOR_H

#include "proto/errbuf.h"
#include "proto/job.h"

typedef struct supervisor_options {
    const job_config *job; /* validated for `workers` ranks */
    int workers;
    const char *worker_path; /* the fsdp-worker executable */
    const char *bind_host;   /* where workers listen for their peers */
} supervisor_options;

/* Runs the job to its end.  Returns 0 when it succeeded, -1 with the reason otherwise. */
int supervisor_run(const supervisor_options *opt, errbuf *err);

#endif
