/* requeue: see requeue.h. */
#include "daemon/requeue.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/path.h"
#include "daemon/log.h"
#include "proto/ckpt.h"

extern char **environ;

static volatile sig_atomic_t early_usr1;

static void on_early_usr1(int sig) {
    (void)sig;
    early_usr1 = 1;
}

void requeue_catch_early_usr1(void) {
    struct sigaction sa = {.sa_handler = on_early_usr1, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL); /* cannot fail for a valid signal and handler */
}

int requeue_take_early_usr1(void) {
    int was = early_usr1;
    early_usr1 = 0;
    return was;
}

int requeue_on_usr1(const job_config *job) {
    if (job->runtime.on_usr1 != JOB_USR1_AUTO) return job->runtime.on_usr1 == JOB_USR1_REQUEUE;
    const char *id = getenv("SLURM_JOB_ID");
    return id && *id;
}

int requeue_latest_step(const job_config *job, int64_t *step, errbuf *err) {
    char path[PATH_BYTES];
    *step = -1;
    int rc = ckpt_resolve(job->checkpoint.dir, JOB_RESUME_AUTO, 0, path, sizeof path, err);
    if (rc <= 0) return rc;
    if (!ckpt_parse_step_name(basename(path), step))
        return errf(err, "%s: not a checkpoint's name", path);
    return 0;
}

int64_t requeue_start_step(const job_config *job) {
    int64_t step;
    errbuf err;
    if (requeue_latest_step(job, &step, &err) == 0) return step;
    log_event(-1, "the checkpoint this run starts after is unknown (%s)", err.msg);
    return -1;
}

/* Reads fd to its end: the first n - 1 bytes into out, NUL-terminated; the rest dropped. */
static void read_output(int fd, char *out, size_t n) {
    size_t have = 0;
    for (;;) {
        char sink[512];
        int keep = have + 1 < n;
        ssize_t got = read(fd, keep ? out + have : sink, keep ? n - 1 - have : sizeof sink);
        if (got == 0 || (got < 0 && errno != EINTR)) break;
        if (got > 0 && keep) have += (size_t)got;
    }
    out[have] = '\0';
}

/* Runs scontrol ARGS...; its output's first n - 1 bytes in out.  0 when it exited 0. */
static int run_scontrol(char *const argv[], char *out, size_t n, errbuf *err) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return errf(err, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc == 0) {
        rc = posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
        if (rc == 0) rc = posix_spawnp(&pid, "scontrol", &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
    }
    close(fds[1]);
    if (rc) {
        close(fds[0]);
        return errf(err, "cannot run scontrol: %s", strerror(rc));
    }
    read_output(fds[0], out, n);
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return errf(err, "waiting for scontrol: %s", strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFEXITED(status)) return errf(err, "scontrol %s %s exited %d", argv[1], argv[2], WEXITSTATUS(status));
    return errf(err, "scontrol %s %s was killed by signal %d", argv[1], argv[2], WTERMSIG(status));
}

/* One field of `scontrol show job -o ID` (JobState=RUNNING, Restarts=1, ...). */
static int job_field(const char *text, const char *job_id, const char *name, char *out, size_t n, errbuf *err) {
    char key[32];
    snprintf(key, sizeof key, " %s=", name);
    const char *at = strstr(text, key);
    if (!at) return errf(err, "scontrol show job %s: no %s", job_id, name);
    at += strlen(key);
    size_t len = strcspn(at, " \n");
    if (len == 0 || len >= n) return errf(err, "scontrol show job %s: a malformed %s", job_id, name);
    memcpy(out, at, len);
    out[len] = '\0';
    return 0;
}

/* The job's JobState and Restarts (the requeues SLURM has counted so far). */
static int job_state(const char *job_id, char *state, size_t n, int *restarts, errbuf *err) {
    char *argv[] = {"scontrol", "show", "job", "-o", (char *)job_id, NULL}, text[8192], count[16];
    if (run_scontrol(argv, text + 1, sizeof text - 1, err)) return -1;
    text[0] = ' '; /* every field then follows a space */
    if (job_field(text, job_id, "JobState", state, n, err) || job_field(text, job_id, "Restarts", count, sizeof count, err))
        return -1;
    char *end;
    long v = strtol(count, &end, 10);
    if (*end || v < 0 || v > INT_MAX) return errf(err, "scontrol show job %s: Restarts=%s is not a count", job_id, count);
    *restarts = (int)v;
    return 0;
}

/* Only a job still RUNNING is requeued: during a preemption's GraceTime and after the
 * time-limit warning it is; after `scancel` it is COMPLETING (observed on SLURM 22.05), and
 * `scontrol requeue` would bring a cancelled job back.  A job COMPLETING whose Restarts is
 * past this run's SLURM_RESTART_COUNT is being requeued by SLURM already (a user's
 * `scontrol requeue`, observed on 22.05): 1, nothing to do. */
static int requeue_job(const slurm_env *env, errbuf *err) {
    char state[64];
    int restarts = 0;
    if (job_state(env->job_id, state, sizeof state, &restarts, err)) return -1;
    if (strcmp(state, "RUNNING") != 0 && restarts > env->restart_count) return 1;
    if (strcmp(state, "RUNNING") != 0)
        return errf(err, "job %s is %s, not RUNNING (cancelled?)", env->job_id, state);
    char *argv[] = {"scontrol", "requeue", (char *)env->job_id, NULL}, ignored[256];
    return run_scontrol(argv, ignored, sizeof ignored, err);
}

int requeue_after_stop(const job_config *job, const slurm_env *env, int64_t start_step, const char *why) {
    if (!env->in_slurm) {
        fprintf(stderr, "fsdpd: %s\n", why);
        return 1;
    }
    int64_t now;
    errbuf err;
    if (requeue_latest_step(job, &now, &err)) {
        fprintf(stderr, "fsdpd: %s; not requeued: %s\n", why, err.msg);
        return 1;
    }
    if (now <= start_step) {
        fprintf(stderr, "fsdpd: %s; not requeued: no checkpoint committed since this run started (latest: %s)\n",
                why, now < 0 ? "none" : "the one it resumed from");
        return 1;
    }
    if (env->node_id != 0) {
        log_event(-1, "%s after the checkpoint of step %lld: node 0 requeues the job", why, (long long)now);
        return 0;
    }
    /* scontrol requeue signals every process of the job at once, this one too: the stop is
     * done, so fsdpd ends with its own status, 0. */
    signal(SIGTERM, SIG_IGN);
    int rc = requeue_job(env, &err);
    if (rc < 0) {
        fprintf(stderr, "fsdpd: %s after the checkpoint of step %lld; no requeue: %s\n", why,
                (long long)now, err.msg);
        return 1;
    }
    if (rc > 0) {
        log_event(-1, "%s after the checkpoint of step %lld: SLURM is requeueing job %s already (scontrol "
                  "requeue?); the next run resumes from it", why, (long long)now, env->job_id);
        return 0;
    }
    log_event(-1, "%s after the checkpoint of step %lld: job %s requeued (scontrol requeue); the next run "
              "resumes from it", why, (long long)now, env->job_id);
    return 0;
}
