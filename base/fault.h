/* fault: test-only fault injection, one overridable table in the spirit of SQLite's.
 *
 * One environment variable, FSDP_FAULTS, read once (fault_init) into a table of entries
 * separated by ';', each NAME=VALUE with VALUE's fields separated by ':':
 *
 *   nan_loss=RANK:STEP            that rank's loss is NaN at that optimizer step
 *   nan_grad=RANK:STEP            one gradient element of that rank is NaN at that step
 *   final_params=PATH             rank 0 writes the final parameters (fp32) to PATH
 *   worker=RANK:ACTION[:STEP]     exit (at STEP), hang (the training thread stops for good
 *                                 after step STEP: a GPU kernel that never finishes),
 *                                 hang_on_stop (never exits after STOP)
 *   ckpt_write=RANK:ACTION[:STEP] stall or die halfway through a shard file (the STEP-th
 *                                 save's, else the first)
 *   ckpt_request=STEP             fsdpd requests a checkpoint once step STEP is reported
 *   comm_stall=RANK:CALL:SECONDS  that rank sleeps before its CALL-th collective
 *   step_delay=RANK:SECONDS       that rank sleeps before every optimizer step (a job slow
 *                                 enough for a test to act on it mid-training)
 *   fabric_root=PATH              the fabric probe looks for /sys and /opt under PATH (a fake
 *                                 EFA or InfiniBand machine, daemon/fabric.h)
 *   host_memory=BYTES             fsdpd reads the node's available memory as BYTES
 *                                 (daemon/host_memory.h)
 *   nccl_hang=CALL                this process's CALL-th NCCL collective waits behind a
 *                                 kernel spinning on a host flag
 *
 * e.g. FSDP_FAULTS="worker=0:exit:2;worker=1:hang_on_stop".  Production code asks for a
 * named point with fault_get (for a rank, or any) and acts on what it returns; nothing else
 * reads the variable, and no core struct carries test fields. */
#ifndef FSDP_FAULT_H
#define FSDP_FAULT_H

#include "base/errbuf.h"
#include "base/path.h"

typedef enum fault_point {
    FAULT_NAN_LOSS,
    FAULT_NAN_GRAD,
    FAULT_FINAL_PARAMS,
    FAULT_WORKER,
    FAULT_CKPT_WRITE,
    FAULT_CKPT_REQUEST,
    FAULT_COMM_STALL,
    FAULT_NCCL_HANG,
    FAULT_STEP_DELAY,
    FAULT_FABRIC_ROOT,
    FAULT_HOST_MEMORY,
    FAULT_POINTS
} fault_point;

typedef struct fault {
    fault_point point;
    int rank;          /* -1 for points without a rank */
    char action[24];   /* worker, ckpt_write */
    long long n;       /* STEP or CALL; 0 when not given */
    double seconds;    /* comm_stall, step_delay */
    char path[PATH_BYTES];   /* final_params, fabric_root */
    int fired;         /* for fault_once */
} fault;

/* Reads FSDP_FAULTS (unset or empty: no faults).  A malformed value is an error naming the
 * entry. */
int fault_init(errbuf *err);
/* Replaces the table with spec (same syntax; NULL or "" clears it): for tests in one
 * process. */
int fault_configure(const char *spec, errbuf *err);
/* The first entry of point p for this rank (entries without a rank match any), or NULL. */
const fault *fault_get(fault_point p, int rank);
/* True the first time it is asked for f (from any thread), false after: a fault that acts
 * once. */
int fault_once(const fault *f);
/* A hang fault: never returns (the process stays alive, doing nothing). */
void fault_hang(void) __attribute__((noreturn));

#endif
