/* ckpt_lock: the lock file of a checkpoint directory, CKPT/fsdpd.lock (DESIGN.md, Checkpoints:
 * one job per checkpoint directory).  The leader of the job that owns the directory holds
 * flock(LOCK_EX) on it for the job's life (daemon/dir_lock.h); the file's content names the
 * holder, so that a job refused at start can say who holds the directory, and a lock whose
 * holder is gone (on a shared file system flock may not reach other hosts) can be told from a
 * live one.  One JSON object, every key required, no other key:
 *
 *     {"format": "fsdpd-lock", "version": 1,
 *      "job_id": SLURM_JOB_ID, "" outside SLURM,
 *      "host": the holder's host name,
 *      "pid": the holder's pid (fsdpd, the leader),
 *      "start_time": the holder's start, in clock ticks after boot (/proc/PID/stat field 22:
 *                    with the pid, a process, whatever pid reuse),
 *      "boot_id": /proc/sys/kernel/random/boot_id of the holder's host (a reboot ends it),
 *      "started": when it took the lock, seconds since the epoch}
 *
 * An empty file names no holder (a lock released at the end of a job). */
#ifndef FSDP_CKPT_LOCK_H
#define FSDP_CKPT_LOCK_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"

#define CKPT_LOCK_FILE "fsdpd.lock"
#define CKPT_LOCK_FORMAT "fsdpd-lock"
#define CKPT_LOCK_VERSION 1
#define CKPT_LOCK_MAX 4096 /* bytes a lock file may hold */

typedef struct ckpt_lock_holder {
    char job_id[64];
    char host[256];
    int pid;
    uint64_t start_time;
    char boot_id[40];
    int64_t started;
} ckpt_lock_holder;

/* The holder as JSON text (one line, malloc'd). */
int ckpt_lock_to_json(const ckpt_lock_holder *h, char **text, errbuf *err);
/* Parses lock-file text: every key present, of its type and in range, no other key; `name`
 * starts every message. */
int ckpt_lock_parse(ckpt_lock_holder *h, const char *text, size_t len, const char *name, errbuf *err);
/* "job 123 (host n0, pid 42, since 2024-05-01 10:00:00 UTC)", for messages. */
void ckpt_lock_describe(const ckpt_lock_holder *h, char *out, size_t n);

#endif
