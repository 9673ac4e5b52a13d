/* dir_lock: the checkpoint directory's lock.  See dir_lock.h. */
#include "daemon/dir_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "daemon/log.h"
#include "daemon/slurm.h"
#include "proto/ckpt_lock.h"

/* Field 22 of /proc/PID/stat (starttime); -1 when the process does not exist. */
static int proc_start_time(int pid, uint64_t *out) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
    if (!p) return -1;
    *out = strtoull(p + 1, NULL, 10);
    return 0;
}

static void read_boot_id(char *out, size_t n) {
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    out[0] = '\0';
    if (f && fgets(out, (int)n, f)) out[strcspn(out, "\n")] = '\0';
    if (f) fclose(f);
}

static int self_holder(ckpt_lock_holder *h, const char *job_id, errbuf *err) {
    memset(h, 0, sizeof *h);
    snprintf(h->job_id, sizeof h->job_id, "%s", job_id);
    if (gethostname(h->host, sizeof h->host - 1) != 0) return errf(err, "gethostname: %s", strerror(errno));
    h->pid = (int)getpid();
    if (proc_start_time(h->pid, &h->start_time)) return errf(err, "cannot read /proc/self/stat");
    read_boot_id(h->boot_id, sizeof h->boot_id);
    h->started = (int64_t)time(NULL);
    return 0;
}

/* The holder the file names: *named 0 when it is empty. */
static int read_holder(int fd, const char *path, ckpt_lock_holder *h, int *named, errbuf *err) {
    char buf[CKPT_LOCK_MAX + 1];
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    if (n < 0) return errf(err, "%s: read: %s", path, strerror(errno));
    *named = n > 0;
    if (!*named) return 0;
    if (ckpt_lock_parse(h, buf, (size_t)n, path, err))
        return errprefix(err, "checkpoint.dir's lock file is not one fsdpd wrote (remove it if no job uses the "
                              "directory)");
    return 0;
}

/* A holder on another host, of another SLURM job: SLURM says whether that job still runs.  1
 * gone (ended, or no longer known), 0 alive or not knowable (*asked: SLURM answered). */
static int slurm_job_over(const char *job_id, int *asked, char *why, size_t n) {
    static const char *const over[] = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
                                       "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "PREEMPTED"};
    char state[64];
    int restarts;
    errbuf err;
    int rc = slurm_job_query(job_id, state, sizeof state, &restarts, &err);
    *asked = rc >= 0;
    if (rc > 0) snprintf(why, n, "SLURM no longer knows job %s", job_id);
    if (rc != 0) return rc > 0;
    for (size_t i = 0; i < sizeof over / sizeof over[0]; i++)
        if (!strcmp(state, over[i])) {
            snprintf(why, n, "SLURM says job %s is %s", job_id, state);
            return 1;
        }
    return 0;
}

/* Whether the named holder is gone (why says how that is known); 0: alive, or not knowable
 * (*verified: known to be alive). */
static int holder_gone(const ckpt_lock_holder *h, const ckpt_lock_holder *self, int *verified, char *why,
                       size_t n) {
    *verified = 1;
    if (!strcmp(h->host, self->host) && !strcmp(h->boot_id, self->boot_id)) {
        uint64_t start;
        if (proc_start_time(h->pid, &start) == 0 && start == h->start_time) return 0;
        snprintf(why, n, "its process %d is gone", h->pid);
        return 1;
    }
    if (!strcmp(h->host, self->host)) {
        snprintf(why, n, "host %s has rebooted since", h->host);
        return 1;
    }
    if (h->job_id[0] && !strcmp(h->job_id, self->job_id)) {
        snprintf(why, n, "an earlier run of this SLURM job (%s): a requeue", h->job_id);
        return 1;
    }
    *verified = 0;
    return h->job_id[0] && slurm_job_over(h->job_id, verified, why, n);
}

static int refuse(const char *dir, const char *path, const ckpt_lock_holder *h, int verified, errbuf *err) {
    char who[512];
    ckpt_lock_describe(h, who, sizeof who);
    if (verified)
        return errf(err, "checkpoint.dir %s is in use by another job (%s): two jobs in one checkpoint "
                         "directory overwrite each other's checkpoints; give this job another "
                         "checkpoint.dir, or stop that job first", dir, who);
    return errf(err, "checkpoint.dir %s is locked by a job on another host (%s), which this host cannot "
                     "check (no SLURM job id, or scontrol cannot tell); give this job another checkpoint.dir, "
                     "or, once that job is known to be over, remove %s", dir, who, path);
}

/* Waits a little for a holder whose file is still being written (truncated, not yet written). */
static int read_live_holder(int fd, const char *path, ckpt_lock_holder *h, errbuf *err) {
    int named = 0;
    for (int i = 0; i < 20 && !named; i++) {
        if (read_holder(fd, path, h, &named, err)) return -1;
        if (!named) clock_sleep_s(0.05);
    }
    if (!named) snprintf(h->host, sizeof h->host, "unknown: the lock file names no holder");
    return 0;
}

static int write_self(int fd, const char *path, const ckpt_lock_holder *self, errbuf *err) {
    char *text;
    if (ckpt_lock_to_json(self, &text, err)) return -1;
    int rc = ftruncate(fd, 0) != 0 ? errf(err, "%s: truncate: %s", path, strerror(errno)) : 0;
    if (rc == 0) rc = file_pwrite_full(fd, text, strlen(text), 0, path, err);
    if (rc == 0 && fsync(fd) != 0) rc = errf(err, "%s: fsync: %s", path, strerror(errno));
    free(text);
    return rc;
}

/* flock is held (or unsupported): the file's holder decides. */
static int take(dir_lock *l, const char *dir, const ckpt_lock_holder *self, errbuf *err) {
    ckpt_lock_holder h;
    int named;
    char why[320], who[512];
    if (read_holder(l->fd, l->path, &h, &named, err)) return -1;
    int verified;
    if (named && !holder_gone(&h, self, &verified, why, sizeof why)) return refuse(dir, l->path, &h, verified, err);
    if (named) {
        ckpt_lock_describe(&h, who, sizeof who);
        log_event(-1, "taking over the stale lock %s of %s: %s", l->path, who, why);
    }
    return write_self(l->fd, l->path, self, err);
}

int dir_lock_acquire(dir_lock *l, const char *dir, const char *job_id, errbuf *err) {
    ckpt_lock_holder self, h;
    l->fd = -1;
    if (path_join(l->path, sizeof l->path, dir, CKPT_LOCK_FILE, err) || self_holder(&self, job_id, err)) return -1;
    int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return errf(err, "%s: %s", l->path, strerror(errno));
    l->fd = fd;
    int rc = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            rc = read_live_holder(fd, l->path, &h, err);
            if (rc == 0) rc = refuse(dir, l->path, &h, 1, err);
        } else if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS) {
            log_event(-1, "%s: this file system has no flock (%s): the lock file's content alone guards it",
                      l->path, strerror(errno));
        } else {
            rc = errf(err, "%s: flock: %s", l->path, strerror(errno));
        }
    }
    if (rc == 0) rc = take(l, dir, &self, err);
    if (rc) {
        close(fd);
        l->fd = -1;
    }
    return rc;
}

void dir_lock_release(dir_lock *l) {
    if (l->fd < 0) return;
    if (ftruncate(l->fd, 0) != 0 || fsync(l->fd) != 0)
        log_event(-1, "%s: cannot empty it: %s (the next job takes it over)", l->path, strerror(errno));
    close(l->fd);
    l->fd = -1;
}
