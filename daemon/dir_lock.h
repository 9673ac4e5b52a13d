/* dir_lock: one job per checkpoint directory (DESIGN.md, Checkpoints).  The leader takes
 * checkpoint.dir's lock (CKPT/fsdpd.lock, proto/ckpt_lock.h) before it writes anything there
 * and holds it for the job's life, restarts included; the other nodes never take it (they
 * write only their own files: shard files, their token-cache copy under a name of their own).
 *
 * Taking it: flock(LOCK_EX | LOCK_NB) on the file.
 *   - flock fails because another process holds it (a live job, on a file system where flock
 *     works): refused, naming the holder the file records.
 *   - flock succeeds but the file names a holder (its job ended without releasing, or flock
 *     does not reach across hosts on this shared file system):
 *       same host and boot: the holder is alive when its pid runs with the recorded start
 *         time: refused; else stale (the process is gone);
 *       same host name, another boot: stale (the host rebooted);
 *       another host, the same SLURM job id: stale (an earlier run of this job: a requeue);
 *       another host, another SLURM job: SLURM is asked (`scontrol show job`): stale when it
 *         no longer knows the job or says it ended (COMPLETED, CANCELLED, FAILED, ...),
 *         refused while it runs, is pending or completing;
 *       another host otherwise (no job id, or scontrol cannot tell): refused — this host
 *         cannot tell whether it still runs (the message names the file to remove once that
 *         job is known to be over).
 *     A stale lock is taken over with a log line naming the old holder and why.
 *   - a file system without flock (ENOLCK, EOPNOTSUPP): the file's content alone decides, as
 *     above, logged.
 * Then the file is rewritten in place (truncate, write, fsync) with this process's identity.
 * Released (emptied, then closed) at the end; a holder that dies leaves a file naming a dead
 * process, taken over by the next job.  Two jobs starting in the same instant on a file system
 * where flock does not reach across hosts can both take it: the file alone is no lock. */
#ifndef FSDP_DIR_LOCK_H
#define FSDP_DIR_LOCK_H

#include "base/errbuf.h"
#include "base/path.h"

typedef struct dir_lock {
    int fd; /* -1: not held */
    char path[PATH_BYTES];
} dir_lock;

/* Takes dir's lock (dir must exist); job_id is SLURM_JOB_ID, "" outside SLURM. */
int dir_lock_acquire(dir_lock *l, const char *dir, const char *job_id, errbuf *err);
/* Empties the file and releases the lock (a lock not held: nothing). */
void dir_lock_release(dir_lock *l);

#endif
