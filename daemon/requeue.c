/* requeue: see requeue.h. */
#include "daemon/requeue.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/path.h"
#include "daemon/log.h"
#include "proto/ckpt.h"

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

/* Only a job still RUNNING is requeued: during a preemption's GraceTime and after the
 * time-limit warning it is; after `scancel` it is COMPLETING (observed on SLURM 22.05), and
 * `scontrol requeue` would bring a cancelled job back.  A job COMPLETING whose Restarts is
 * past this run's SLURM_RESTART_COUNT is being requeued by SLURM already (a user's
 * `scontrol requeue`, observed on 22.05): 1, nothing to do. */
static int requeue_job(const slurm_env *env, errbuf *err) {
    char state[64];
    int restarts = 0;
    int rc = slurm_job_query(env->job_id, state, sizeof state, &restarts, err);
    if (rc > 0) return errf(err, "SLURM no longer knows job %s", env->job_id);
    if (rc < 0) return -1;
    if (strcmp(state, "RUNNING") != 0 && restarts > env->restart_count) return 1;
    if (strcmp(state, "RUNNING") != 0)
        return errf(err, "job %s is %s, not RUNNING (cancelled?)", env->job_id, state);
    char *argv[] = {"scontrol", "requeue", (char *)env->job_id, NULL}, ignored[256];
    return slurm_scontrol(argv, ignored, sizeof ignored, err);
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
