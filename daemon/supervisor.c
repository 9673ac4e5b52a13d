/* supervisor: fsdpd's workers on one libevent loop, from spawn to exit; see supervisor.h. */
#include "daemon/supervisor.h"

#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/fileio.h"
#include "base/fault.h"
#include "daemon/ckpt_commit.h"
#include "daemon/cluster.h"
#include "daemon/locator.h"
#include "daemon/log.h"
#include "daemon/memory_ckpt.h"
#include "daemon/mlflow_log.h"
#include "daemon/model_shm.h"
#include "daemon/replica.h"
#include "daemon/requeue.h"
#include "daemon/run_report.h"
#include "daemon/sample_prompts.h"
#include "daemon/status_server.h"
#include "daemon/straggler.h"
#include "daemon/tensorboard.h"
#include "kernels/kernels.h"
#include "model/step_plan.h"
#include "proto/msg.h"
#include "proto/nccl_log.h"

#define WORKER_CTL_FD 3
#define WORKER_MODEL_FD 4
#define WORKER_MEMORY_FD 5 /* the node's in-memory images, 2 a worker place (daemon/memory_ckpt.h) */

typedef enum phase { PHASE_SETUP, PHASE_TRAINING, PHASE_STOPPING } phase; /* supervisor.h draws them */

typedef struct worker {
    supervisor *sup;
    int rank;
    pid_t pid;
    struct bufferevent *bev; /* NULL once the connection is closed */
    msg_decoder dec;
    int exited, status;      /* from waitpid */
    int finished;            /* exited and connection closed: judged */
    int ready;
    int reported;            /* sent FATAL: its exit status is the consequence, not the cause */
    int killed;              /* fsdpd sent it SIGKILL */
    char addr[MSG_ADDR_MAX];
    double last_seen;
    long long mem_bytes;     /* its context memory, from its heartbeats (-1: not reported) */
    int has_coll;            /* its collectives, from its heartbeats (daemon/locator.h) */
    msg_coll coll;
    double coll_changed_at;  /* when they last moved */
    long long work_done;     /* its training's progress, from its heartbeats (0: not begun) */
    long long work_step;     /* and its step then */
    double work_at;          /* when work_done last moved (the stall watch) */
    int has_timing;          /* its steps' times, from its heartbeats (daemon/straggler.h) */
    msg_timing timing;
    int has_net;             /* its network, from its ready heartbeat */
    msg_net net;
} worker;

struct supervisor {
    const supervisor_options *opt;
    job_config job;      /* opt->job with the resumed checkpoint's global_batch and seed */
    ckpt_start ckpt_start;
    int memory_slots;    /* images a rank keeps this run (daemon/memory_ckpt.h) */
    msg_peers replicas;  /* the spares that take copies of them (daemon/replica.h) */
    replica_source *source;
    long long sealed_step; /* the memory step this node's workers reported last, and how many */
    int sealed;
    int model_fd; /* the sealed model image the workers load from; -1 when resuming */
    ckpt_coord *ckpt;
    struct event_base *base;
    worker *workers;
    int n_finished, n_addr, n_ready;
    const char *fabric; /* how the ranks talk, once they were told: "nccl", "tcp"; "none" for a
                         * lone worker; NULL before */
    phase phase;
    int failed;
    int reason_reported;  /* the reason came from a worker's FATAL */
    int reason_permanent; /* and no restart can cure it */
    errbuf reason;
    double grace_at;      /* when the grace timer fires (0: not armed) */
    int sigint_count;
    FILE *metrics;
    FILE *samples; /* OUTPUT_DIR/samples.jsonl, opened at the first SAMPLE */
    tb_writer *tb;          /* runtime.log_to tensorboard, on the leader */
    status_server *status;
    json_t *last_metrics;   /* rank 0's last METRICS, for the status socket */
    int run_marked;         /* this run's first metrics line carries "run_start" */
    int has_eval;           /* the last eval loss rank 0 reported (data.eval_fraction) */
    double eval_loss;
    long long eval_step;
    long long stop_request; /* a graceful stop waits for this checkpoint request (0: none) */
    long long stop_step;    /* and for the commit of this step's save, which serves it */
    int stop_sync;          /* the workers save at once and stop by themselves (SIGTERM) */
    int stop_settled;       /* the stop's save is committed or given up */
    char stop_why[256];
    int signalled; /* the signal that stopped the job, 0 when none */
    json_t *behind; /* what the hung-rank locator found at the first failure (NULL: not run) */
    straggler_watch *stragglers; /* the leader's, runtime.straggler_factor > 0 (NULL: none) */
    struct event *sigchld, *sigint, *sigterm, *sigusr1, *term_deadline, *grace, *heartbeat;
};

/* ---- stopping ---- */

static void kill_all(supervisor *s) {
    for (int r = 0; r < s->opt->workers; r++)
        if (s->workers[r].pid > 0 && !s->workers[r].exited) {
            s->workers[r].killed = 1;
            kill(s->workers[r].pid, SIGKILL);
        }
}

static void send_msg(worker *w, const msg *m);
static long long request_checkpoint(supervisor *s, const char *why);
static void stop_for_sigterm(supervisor *s, int sig, const char *why);
static void locate_hung(supervisor *s);
static int multi_node(const supervisor *s) { return cluster_nodes(s->opt->cluster) > 1; }
/* On several nodes the leader's coordinator commits every save; the others relay to it. */
static int is_follower(const supervisor *s) { return cluster_node(s->opt->cluster) != 0; }
static int has_images(const supervisor *s) { return s->opt->memory && s->opt->memory->fd; }
/* The local worker of a global rank, NULL for another node's. */
static worker *local_worker(supervisor *s, int rank) {
    int first = cluster_node(s->opt->cluster) * s->opt->workers;
    return rank >= first && rank < first + s->opt->workers ? &s->workers[rank - first] : NULL;
}

/* A failed job's survivors get at most this long before SIGKILL: nothing they could still
 * do commits (a checkpoint needs every rank), and a rank waiting in an NCCL collective for
 * the dead one cannot read STOP before its comm timeout (runtime.comm_timeout_s). */
#define FAILURE_GRACE_S 2

/* Arms the grace timer to fire in `seconds`, unless it already fires as soon: a failure seen
 * again (a stalled rank, at every heartbeat check) must not push the kill back forever. */
static void arm_grace(supervisor *s, int seconds) {
    double at = clock_now_s() + seconds;
    if (s->grace_at > 0 && s->grace_at <= at) return;
    s->grace_at = at;
    struct timeval grace = {seconds, 0};
    evtimer_add(s->grace, &grace);
}

/* Sends STOP to every worker still running and gives them stop_grace_s to exit (after a
 * failure, FAILURE_GRACE_S at most). */
/* The one place the phase changes: forward only (SETUP -> TRAINING, either -> STOPPING). */
static void set_phase(supervisor *s, phase to) {
    assert(to > s->phase && (to == PHASE_STOPPING || s->phase == PHASE_SETUP));
    s->phase = to;
}

static void begin_stop(supervisor *s, const char *reason) {
    int grace_s = s->job.runtime.stop_grace_s;
    if (s->failed && grace_s > FAILURE_GRACE_S) grace_s = FAILURE_GRACE_S;
    if (s->phase == PHASE_STOPPING) {
        if (s->failed) arm_grace(s, grace_s); /* a failure during a graceful stop: sooner */
        return;
    }
    set_phase(s, PHASE_STOPPING);
    log_event(-1, "stopping the workers: %s", reason);
    if (!s->failed && multi_node(s)) cluster_stop_all(s->opt->cluster, reason); /* the leader's */
    msg stop = {.type = MSG_STOP};
    snprintf(stop.u.stop.reason, sizeof stop.u.stop.reason, "%s", reason);
    for (int r = 0; r < s->opt->workers; r++)
        if (!s->workers[r].exited) send_msg(&s->workers[r], &stop);
    arm_grace(s, grace_s);
}

typedef enum failure_kind {
    FAILURE_REPORTED,     /* a worker's FATAL, or fsdpd's own finding */
    FAILURE_SILENT_DEATH, /* a worker died without a word */
    FAILURE_PERMANENT,    /* a worker's FATAL that no restart can cure (loading, validating) */
} failure_kind;

/* Records a failure and stops the others.  The first one is the job's reason, except that
 * a worker dying without a word (a crash, a kill, an exit without FATAL) outranks a FATAL
 * report: the reports that follow such a death are usually its consequence ("rank 0 closed
 * the connection"), and may arrive before the death is noticed. */
static void record_failure(supervisor *s, failure_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void record_failure(supervisor *s, failure_kind kind, const char *fmt, ...) {
    char msg[sizeof s->reason.msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_event(-1, "%s", msg);
    int silent_death = kind == FAILURE_SILENT_DEATH;
    /* A later failure is the job's reason when it is the likelier cause: a death without a
     * word over the others' reports of it, and a failure no restart cures (a rank that cannot
     * load its checkpoint) over a peer's report of the connection it then closed, which would
     * otherwise have the job restarted into the same failure. */
    if (!s->failed || (silent_death && s->reason_reported && !s->reason_permanent) ||
        (kind == FAILURE_PERMANENT && !s->reason_permanent)) {
        s->failed = 1;
        s->reason_reported = !silent_death;
        s->reason_permanent = kind == FAILURE_PERMANENT;
        errf(&s->reason, "%s", msg);
    }
    if (!s->behind && s->phase == PHASE_TRAINING && !is_follower(s)) locate_hung(s);
    if (multi_node(s)) cluster_fail(s->opt->cluster, msg, s->reason_permanent); /* the leader stops every node */
    begin_stop(s, msg);
}
#define fail(s, ...) record_failure(s, FAILURE_REPORTED, __VA_ARGS__)

static void on_grace_expired(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    supervisor *s = arg;
    s->grace_at = 0;
    log_event(-1, "workers still running after the grace of their stop: killing them");
    kill_all(s);
}

/* ---- one worker ---- */

static void close_connection(worker *w) {
    if (w->bev) bufferevent_free(w->bev);
    w->bev = NULL;
}

/* A worker's death: news unless it said why (FATAL) before. */
static failure_kind death_kind(const worker *w) {
    return w->reported ? FAILURE_REPORTED : FAILURE_SILENT_DEATH;
}

/* A worker is judged once it has exited and its connection is drained, so a FATAL sent
 * just before exiting is read before the exit status speaks. */
static void maybe_finish(worker *w) {
    supervisor *s = w->sup;
    if (w->finished || !w->exited || w->bev) return;
    w->finished = 1;
    s->n_finished++;
    if (WIFSIGNALED(w->status)) {
        /* A signal fsdpd did not send is a failure, even while stopping: it may be the cause
         * of failures reported before it was noticed.  fsdpd's own SIGKILL is no news. */
        if (!w->killed)
            record_failure(s, death_kind(w), "rank %d was killed by signal %d (%s)", w->rank,
                           WTERMSIG(w->status), strsignal(WTERMSIG(w->status)));
        else
            log_event(w->rank, "killed by signal %d", WTERMSIG(w->status));
    } else if (WEXITSTATUS(w->status) != 0) {
        record_failure(s, death_kind(w), "rank %d exited with status %d", w->rank,
                       WEXITSTATUS(w->status));
    } else {
        log_event(w->rank, "exited");
    }
    /* The leader's loop also waits for every other node's report; the cluster ends it. */
    if (s->n_finished == s->opt->workers && cluster_done(s->opt->cluster, s->failed)) event_base_loopbreak(s->base);
}

static void send_msg(worker *w, const msg *m) {
    uint8_t *frame;
    size_t len;
    errbuf err;
    if (!w->bev) return;
    if (msg_encode(m, &frame, &len, &err)) {
        fail(w->sup, "rank %d: %s", w->rank, err.msg);
        return;
    }
    bufferevent_write(w->bev, frame, len);
    free(frame);
}

/* The NCCL unique id of global rank 0: every local rank (that one included) gets it. */
static void send_nccl_id(void *arg, const msg *id) {
    supervisor *s = arg;
    for (int r = 0; r < s->opt->workers; r++) send_msg(&s->workers[r], id);
    s->fabric = "nccl";
}

static void relay_nccl_id(supervisor *s, worker *from, const msg *id) {
    if (from->rank != 0) {
        fail(s, "rank %d sent an unexpected NCCL_ID message", from->rank);
        return;
    }
    if (multi_node(s)) cluster_relay_nccl_id(s->opt->cluster, id); /* every node's daemon */
    else send_nccl_id(s, id);
}

/* Every rank's address (the whole job's rank table) to the local workers. */
static void send_peers(void *arg, const msg_peers *table) {
    supervisor *s = arg;
    msg peers = {.type = MSG_PEERS, .u.peers = *table};
    s->fabric = "tcp";
    for (int r = 0; r < s->opt->workers; r++) send_msg(&s->workers[r], &peers);
}

/* Every local worker has its address: the rank table, of this node or of every node. */
static void collect_addrs(supervisor *s) {
    char (*addrs)[MSG_ADDR_MAX] = calloc((size_t)s->opt->workers, sizeof *addrs);
    if (!addrs) {
        fail(s, "out of memory for the rank table");
        return;
    }
    for (int r = 0; r < s->opt->workers; r++) strcpy(addrs[r], s->workers[r].addr);
    msg_peers local = {.n = s->opt->workers, .addrs = addrs};
    if (multi_node(s)) cluster_addrs(s->opt->cluster, &local);
    else send_peers(s, &local);
    free(addrs);
}

/* The step line: after the step's figures, the label tokens beside the tokens the step
 * computed, the elapsed time and the ETA (daemon/run_report.h); every runtime.log_every steps,
 * the last step and a step with an eval loss always. */
static void print_step(supervisor *s, const msg_metrics *x) {
    run_progress *p = s->opt->progress;
    if (p) run_report_note_step(p, x->step, x->total_steps, x->loss, x->tokens, x->tokens_seen, x->seconds);
    int every = s->job.runtime.log_every > 0 ? s->job.runtime.log_every : 1;
    if (x->step % every != 0 && x->step != x->total_steps && !x->has_eval_loss) return;
    printf("step %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tokens/s", (long long)x->step,
           (long long)x->total_steps, x->loss, x->lr, x->grad_norm,
           x->seconds > 0 ? (double)x->tokens / x->seconds : 0.0);
    if (p) {
        char elapsed[32], eta[32];
        run_report_duration(clock_now_s() - p->started, elapsed, sizeof elapsed);
        run_report_duration(run_report_eta(p), eta, sizeof eta);
        printf("  tokens %lld/%lld  elapsed %s  eta %s", (long long)x->tokens,
               (long long)s->job.train.global_batch * s->job.data.seq_len, elapsed, eta);
    }
    printf("\n");
}

/* The first metrics line of a run says how the run began ("run_start": {"kind", "from_step"}),
 * for `fsdpctl plot`'s markers: "start" (step 0), "resume" (from a checkpoint), "restart"
 * (fsdpd's own, after a failure), "requeue" (SLURM's relaunch, SLURM_RESTART_COUNT > 0). */
static int mark_run_start(supervisor *s, json_t *line) {
    if (s->run_marked) return 0;
    s->run_marked = 1;
    const char *requeue = getenv("SLURM_RESTART_COUNT");
    long long from = s->ckpt_start.resume_dir[0] ? s->ckpt_start.resume_step : 0;
    const char *kind = s->opt->restart > 0 ? "restart"
                       : requeue && *requeue && strcmp(requeue, "0") && from > 0 ? "requeue"
                       : from > 0 ? "resume" : "start";
    return json_object_set_new(line, "run_start", json_pack("{s:s, s:I}", "kind", kind, "from_step", (json_int_t)from));
}

/* Rank 0's step to runtime.log_to's destinations; a TensorBoard file that cannot be written is
 * logged once and closed (the job goes on: metrics.jsonl has every step). */
static void log_step(supervisor *s, const msg_metrics *x) {
    mlflow_log_step(s->opt->mlflow, x);
    errbuf err;
    if (s->tb && tb_writer_step(s->tb, x, &err)) {
        log_event(-1, "runtime.log_to tensorboard: %s; no more TensorBoard events this run", err.msg);
        tb_writer_close(s->tb);
        s->tb = NULL;
    }
}

/* Prints the step and appends the metrics line: the METRICS message, its rank and the time. */
static void on_metrics(supervisor *s, worker *w, const msg *m) {
    const msg_metrics *x = &m->u.metrics;
    const fault *request = fault_get(FAULT_CKPT_REQUEST, -1);
    if (request && x->step >= request->n && fault_once(request)) request_checkpoint(s, "fault ckpt_request");
    print_step(s, x);
    fflush(stdout);
    if (!s->metrics) return;
    errbuf err;
    json_t *line = msg_to_json(m, &err);
    char *text = NULL;
    if (line && !json_object_set_new(line, "rank", json_integer(w->rank)) &&
        !json_object_set_new(line, "time", json_real((double)time(NULL))) && !mark_run_start(s, line))
        text = json_dumps(line, JSON_COMPACT);
    if (!text || fprintf(s->metrics, "%s\n", text) < 0 || fflush(s->metrics) != 0)
        log_event(-1, "cannot append to the metrics file: %s", text ? strerror(errno) : "out of memory");
    free(text);
    json_decref(line);
    if (w->rank == 0) log_step(s, x);
}

/* ---- samples during training (daemon/sample_prompts.h) ---- */

static int open_samples(supervisor *s, errbuf *err) {
    char path[JOB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/samples.jsonl", s->job.output.dir);
    int fd = file_open_append(path, err);
    if (fd < 0) return -1;
    if (!(s->samples = fdopen(fd, "a"))) {
        close(fd);
        return errf(err, "%s: fdopen: %s", path, strerror(errno));
    }
    return 0;
}

/* Rank 0's reply: to the log and samples.jsonl, the SAMPLE body with the prompt's and the
 * reply's text (and the prompt's ids) beside. */
static void on_sample(supervisor *s, const msg *m) {
    const msg_sample *x = &m->u.sample;
    const sample_prompts *sp = s->opt->samples;
    errbuf err;
    if (!sp || x->prompt_index >= sp->p.n) {
        fail(s, "rank 0 sent a SAMPLE for prompt %d of %d", x->prompt_index, sp ? sp->p.n : 0);
        return;
    }
    const int32_t *prompt = sp->p.ids + sp->p.offsets[x->prompt_index];
    int prompt_n = sp->p.offsets[x->prompt_index + 1] - sp->p.offsets[x->prompt_index];
    int32_t *ids = NULL;
    int n = 0;
    char *prompt_text = NULL, *reply = NULL, *line_text = NULL;
    json_t *line = NULL;
    int rc = msg_ids_read(x->reply_ids, &ids, &n, &err);
    if (rc == 0 && (!(prompt_text = sample_prompts_text(sp, prompt, prompt_n, &err)) ||
                    !(reply = sample_prompts_text(sp, ids, n, &err))))
        rc = -1;
    if (rc == 0 && !s->samples) rc = open_samples(s, &err);
    if (rc == 0) {
        line = msg_to_json(m, &err);
        rc = line && !json_object_set_new(line, "prompt", json_string(prompt_text)) &&
                     !json_object_set_new(line, "prompt_ids", msg_ids_json(prompt, prompt_n)) &&
                     !json_object_set_new(line, "reply", json_string(reply)) &&
                     !json_object_set_new(line, "time", json_real((double)time(NULL))) &&
                     (line_text = json_dumps(line, JSON_COMPACT))
                 ? 0
                 : errf(&err, "out of memory");
    }
    if (rc == 0 && (fprintf(s->samples, "%s\n", line_text) < 0 || fflush(s->samples) != 0))
        rc = errf(&err, "%s", strerror(errno));
    if (rc == 0) {
        char *quoted = json_dumps(json_object_get(line, "reply"), JSON_ENCODE_ANY);
        log_event(-1, "sample after step %lld, prompt %d (%d tokens, %s): %s", (long long)x->step,
                  x->prompt_index, n, x->stop, quoted ? quoted : "?");
        free(quoted);
    } else {
        log_event(-1, "cannot write the sample of step %lld, prompt %d: %s", (long long)x->step,
                  x->prompt_index, err.msg);
    }
    free(line_text);
    json_decref(line);
    free(prompt_text);
    free(reply);
    free(ids);
}

/* ---- checkpoints ---- */

static void ckpt_send(void *arg, int rank, const msg *m) {
    supervisor *s = arg;
    worker *w = local_worker(s, rank);
    if (w) send_msg(w, m);
    else cluster_to_rank(s->opt->cluster, rank, m);
}

static void ckpt_broadcast(void *arg, const msg *m) {
    supervisor *s = arg;
    for (int r = 0; r < s->opt->workers; r++) send_msg(&s->workers[r], m);
    if (multi_node(s)) cluster_to_followers(s->opt->cluster, m);
}

/* This node's shard files (rank f writes file f: the node's first places). */
static int local_files(const supervisor *s) {
    int first = cluster_node(s->opt->cluster) * s->opt->workers;
    int n = ckpt_n_files(&s->job, s->opt->workers * cluster_nodes(s->opt->cluster)) - first;
    return n < 0 ? 0 : n < s->opt->workers ? n : s->opt->workers;
}

/* Once every file of this node is sealed at a memory step, its copies go to the spares. */
static void note_sealed(supervisor *s, const msg_ckpt_done *d) {
    if (!s->source || !d->memory || !d->ok || d->step < s->sealed_step) return;
    if (d->step > s->sealed_step) s->sealed_step = d->step, s->sealed = 0;
    if (++s->sealed == local_files(s)) replica_source_push(s->source, d->step);
}

/* A worker's CKPT_DONE: to the coordinator, the leader's on several nodes. */
static void on_ckpt_done(supervisor *s, const msg *m) {
    note_sealed(s, &m->u.ckpt_done);
    if (is_follower(s)) cluster_to_leader(s->opt->cluster, m);
    else ckpt_coord_on_done(s->ckpt, m->u.ckpt_done.rank, &m->u.ckpt_done);
}

/* A follower asks the leader for what its signal or status socket asked of it. */
static long long forward_request(supervisor *s, const char *kind, const char *why) {
    msg m = {.type = MSG_CKPT_REQUEST};
    snprintf(m.u.ckpt_request.kind, sizeof m.u.ckpt_request.kind, "%s", kind);
    snprintf(m.u.ckpt_request.why, sizeof m.u.ckpt_request.why, "%s on node %d", why, cluster_node(s->opt->cluster));
    cluster_to_leader(s->opt->cluster, &m);
    log_event(-1, "%s: asked the leader for a %s", why, strcmp(kind, "checkpoint") ? "stop with a checkpoint" : "checkpoint");
    return STATUS_REQUEST_FORWARDED;
}

static void ckpt_fatal(void *arg, const char *reason) {
    fail((supervisor *)arg, "%s", reason);
}

static void ckpt_fatal_permanent(void *arg, const char *reason) {
    record_failure((supervisor *)arg, FAILURE_PERMANENT, "%s", reason);
}

static long long request_checkpoint(supervisor *s, const char *why) {
    if (s->phase != PHASE_TRAINING) return 0;
    if (is_follower(s)) return forward_request(s, "checkpoint", why);
    return ckpt_coord_request(s->ckpt, why, 0);
}

/* ---- graceful stop and status ---- */

/* A stop after a checkpoint.  sync: the workers save synchronously after the step they are in
 * and stop by themselves (SIGTERM: no step after the save, nothing left to write); else they
 * save at the next step where no save is being written, train on, and get STOP once the
 * commit is over.  A synchronous stop replaces a pending plain one. */
static long long request_stop(supervisor *s, const char *why, int sync) {
    if (s->phase == PHASE_STOPPING) return -1;
    if (s->stop_request && (s->stop_sync || !sync)) return s->stop_request;
    if (is_follower(s)) return forward_request(s, sync ? "stop_sync" : "stop", why); /* the leader stops every node */
    if (s->phase != PHASE_TRAINING) {
        begin_stop(s, why);
        return 0;
    }
    long long id = ckpt_coord_request(s->ckpt, why, sync);
    s->stop_request = id;
    s->stop_step = 0;
    s->stop_sync = sync;
    snprintf(s->stop_why, sizeof s->stop_why, "%s", why);
    log_event(-1, "%s: the workers stop once checkpoint request %lld is committed", why, id);
    return id;
}

/* ---- the status socket's requests (status_server.h's hooks: fsdpctl checkpoint|stop) ---- */

static long long status_request_checkpoint(void *arg, const char *why) {
    return request_checkpoint(arg, why);
}

/* A graceful stop: the workers save, train on, and get STOP once the commit is over. */
static long long status_request_stop(void *arg, const char *why) {
    return request_stop(arg, why, 0);
}

/* Kept for the status socket; a save that serves the stop's request names the step whose
 * commit the stop waits for. */
/* ---- rank 0's figures and settled saves (on_metrics; the coordinator's settled hook) ---- */

static void note_rank0_metrics(supervisor *s, const msg *m) {
    errbuf err;
    json_decref(s->last_metrics);
    s->last_metrics = msg_to_json(m, &err);
    const msg_metrics *x = &m->u.metrics;
    if (x->has_eval_loss) {
        s->has_eval = 1;
        s->eval_loss = x->eval_loss;
        s->eval_step = x->step;
        if (s->opt->progress) run_report_note_eval(s->opt->progress, x->step, x->eval_loss);
        log_event(-1, "eval loss %.4f after step %lld", x->eval_loss, (long long)x->step);
    }
    if (s->stop_request && !s->stop_step && x->has_checkpoint && strcmp(x->checkpoint.mode, "skipped") != 0 &&
        x->checkpoint.request >= s->stop_request)
        s->stop_step = x->checkpoint.step;
}

static void ckpt_settled(void *arg, long long step, int committed) {
    supervisor *s = arg;
    if (!s->stop_step || step != s->stop_step) return;
    s->stop_settled = 1;
    log_event(-1, "checkpoint of step %lld %s: stopping", step,
              committed ? "committed" : "not committed (latest is the one before)");
    begin_stop(s, s->stop_why);
}

/* ---- the status reply (status_of: the status socket; the cluster's heartbeat rows) ---- */

static const char *phase_name(const supervisor *s) {
    static const char *const phases[] = {[PHASE_SETUP] = "setup", [PHASE_TRAINING] = "training",
                                         [PHASE_STOPPING] = "stopping"};
    return phases[s->phase];
}

/* This node's workers as the supervisor knows them ({"rank", "pid", "running", "mem_bytes"}). */
static json_t *local_rank_rows(const supervisor *s) {
    json_t *ranks = json_array();
    for (int r = 0; r < s->opt->workers; r++) {
        const worker *w = &s->workers[r];
        json_t *row = json_pack("{s:i, s:i, s:b}", "rank", w->rank, "pid", (int)w->pid, "running",
                                w->pid > 0 && !w->exited);
        if (row && w->mem_bytes >= 0) json_object_set_new(row, "mem_bytes", json_integer(w->mem_bytes));
        if (row && w->has_coll) {
            json_object_set_new(row, "coll", json_pack("{s:I, s:I, s:s, s:i}", "started", (json_int_t)w->coll.started,
                                                       "finished", (json_int_t)w->coll.finished, "op", w->coll.op,
                                                       "unit", w->coll.unit));
            json_object_set_new(row, "coll_still_s", json_real(clock_now_s() - w->coll_changed_at));
        }
        if (row && w->work_done > 0) /* the stall watch's figures (on_heartbeat_check) */
            json_object_set_new(row, "progress", json_pack("{s:I, s:I, s:f}", "work", (json_int_t)w->work_done, "step",
                                                           (json_int_t)w->work_step, "still_s",
                                                           clock_now_s() - w->work_at));
        if (row && w->has_timing)
            json_object_set_new(row, "timing", json_pack("{s:I, s:f, s:f, s:f}", "steps", (json_int_t)w->timing.steps,
                                                         "step_s", w->timing.step_s, "comm_s", w->timing.comm_s,
                                                         "data_s", w->timing.data_s));
        if (row && w->has_net)
            json_object_set_new(row, "net", json_pack("{s:s, s:o}", "transport", w->net.transport, "busbw_gbps",
                                                      w->net.measured ? json_real(w->net.busbw_gbps) : json_null()));
        json_array_append_new(ranks, row);
    }
    return ranks;
}

/* Adds "node" to each row of rows (an array of objects). */
static void tag_node(json_t *rows, int node) {
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) json_object_set_new(row, "node", json_integer(node));
}

/* Every rank the status shows: this node's (as the supervisor knows them); on the leader
 * also every other node's, from its last heartbeat; "nodes" on several nodes. */
static void add_ranks(const supervisor *s, json_t *out) {
    json_t *ranks = local_rank_rows(s);
    tag_node(ranks, cluster_node(s->opt->cluster));
    if (multi_node(s)) {
        json_t *mine = status_rank_rows(ranks, s->job.runtime.backend == JOB_BACKEND_CUDA);
        json_t *nodes = cluster_status(s->opt->cluster, mine, phase_name(s));
        json_decref(mine);
        size_t i;
        json_t *node;
        json_array_foreach(nodes, i, node) {
            int id = (int)json_integer_value(json_object_get(node, "node"));
            if (id == cluster_node(s->opt->cluster) || !json_object_get(node, "ranks")) continue;
            json_t *theirs = json_deep_copy(json_object_get(node, "ranks"));
            tag_node(theirs, id);
            json_array_extend(ranks, theirs);
            json_decref(theirs);
        }
        json_object_set_new(out, "nodes", nodes);
    }
    json_object_set_new(out, "ranks", ranks);
}

/* At the job's first failure, on the leader: the ranks a hung collective waits for, from
 * every rank's last heartbeat (daemon/locator.h), logged and kept for the status. */
static void locate_hung(supervisor *s) {
    json_t *now = json_object();
    add_ranks(s, now);
    s->behind = locator_find(json_object_get(now, "ranks"), json_object_get(now, "nodes"),
                             1.5 * s->job.runtime.heartbeat_s);
    json_decref(now);
    size_t i;
    json_t *line;
    json_array_foreach(s->behind, i, line) log_event(-1, "hung-rank locator: %s", json_string_value(line));
    /* the ranks that were slow before it: often where a hang or a crash began */
    json_t *slow = s->stragglers ? straggler_watch_status(s->stragglers) : NULL;
    json_array_foreach(slow, i, line)
        log_event(-1, "at the failure, rank %d on node %d was a straggler (phase %s, %.3f s a step of its own against "
                      "the others' %.3f s)", (int)json_integer_value(json_object_get(line, "rank")),
                  (int)json_integer_value(json_object_get(line, "node")), json_string_value(json_object_get(line, "phase")),
                  json_number_value(json_object_get(line, "own_s")), json_number_value(json_object_get(line, "median_own_s")));
    json_decref(slow);
}

static void status_of(void *arg, json_t *out) {
    const supervisor *s = arg;
    add_ranks(s, out);
    json_object_set_new(out, "state", json_string(phase_name(s)));
    json_object_set_new(out, "stop_requested", json_boolean(s->stop_request != 0));
    /* a follower's ranks send no METRICS: the job's step is the leader's (its heartbeats) */
    const json_t *metrics = s->last_metrics ? s->last_metrics : cluster_leader_progress(s->opt->cluster);
    json_object_set(out, "metrics", metrics ? (json_t *)metrics : json_null());
    json_object_set_new(out, "last_error", s->failed ? json_string(s->reason.msg) : json_null());
    json_object_set_new(out, "fabric", s->fabric ? json_string(s->fabric) : json_null());
    json_object_set(out, "behind", s->behind ? s->behind : json_null());
    if (s->stragglers) json_object_set_new(out, "stragglers", straggler_watch_status(s->stragglers));
    json_object_set_new(out, "eval", s->has_eval ? json_pack("{s:f, s:I}", "loss", s->eval_loss, "step",
                                                              (json_int_t)s->eval_step)
                                                  : json_null());
    json_object_set_new(out, "fabric_found", s->opt->fabric_found ? json_string(s->opt->fabric_found) : json_null());
    int failed = 0;
    const char *save_error = NULL;
    if (s->ckpt) ckpt_coord_save_failures(s->ckpt, &failed, &save_error);
    json_object_set_new(out, "failed_saves", json_integer(failed));
    json_object_set_new(out, "last_save_error", save_error ? json_string(save_error) : json_null());
}

/* ---- the workers' set-up: CONFIG and START (handle_message; the cluster's start hook) ---- */

/* CONFIG: the worker's place, the resolved job and the model's config. */
static void send_config(supervisor *s, worker *w) {
    static msg m; /* one job config at a time, from the event loop */
    memset(&m, 0, sizeof m);
    m.type = MSG_CONFIG;
    msg_config *c = &m.u.config;
    *c = (msg_config){.rank = w->rank, .world = s->opt->workers * cluster_nodes(s->opt->cluster),
                      .local_rank = (int)(w - s->workers), .node = cluster_node(s->opt->cluster),
                      .job = s->job, .model = s->ckpt_start.model, .ckpt_attempt = s->ckpt_start.attempt,
                      .model_fd = s->model_fd >= 0 ? WORKER_MODEL_FD : -1};
    snprintf(c->bind_host, sizeof c->bind_host, "%s", cluster_host(s->opt->cluster));
    strcpy(c->secret, cluster_secret_hex(s->opt->cluster));
    strcpy(c->resume_dir, s->ckpt_start.resume_dir);
    c->memory_fd = has_images(s) ? WORKER_MEMORY_FD : -1;
    c->memory_slots = has_images(s) ? s->memory_slots : 0;
    c->memory_resume = s->ckpt_start.from_memory != 0;
    const sample_prompts *sp = s->opt->samples;
    if (sp && sp->p.n && !(c->samples = msg_sample_prompts_json(&sp->p))) {
        fail(s, "rank %d: out of memory for its CONFIG", w->rank);
        return;
    }
    send_msg(w, &m);
    msg_free(&m);
}

static void start_training(void *arg) {
    supervisor *s = arg;
    if (s->phase != PHASE_SETUP) return; /* a stop came first */
    set_phase(s, PHASE_TRAINING);
    log_event(-1, "all %d workers ready: training", s->opt->workers * cluster_nodes(s->opt->cluster));
    msg start = {.type = MSG_START};
    for (int r = 0; r < s->opt->workers; r++) send_msg(&s->workers[r], &start);
}

/* ---- the cluster's hooks (daemon/cluster.h: what the other nodes say) ---- */

/* Another node failed, or the link to it: this node stops too; or the leader stops the job
 * gracefully. */
static void cluster_stopped(void *arg, const char *reason, int failed, int permanent) {
    supervisor *s = arg;
    if (failed) record_failure(s, permanent ? FAILURE_PERMANENT : FAILURE_REPORTED, "%s", reason);
    else begin_stop(s, reason);
}

/* A follower: the leader's coordinator speaks to this node's workers. */
static void cluster_to_workers(void *arg, const msg *m) {
    supervisor *s = arg;
    if (m->type == MSG_CKPT_BEGIN) {
        for (int r = 0; r < s->opt->workers; r++) send_msg(&s->workers[r], m);
        return;
    }
    worker *w = local_worker(s, m->u.ckpt_abort.rank);
    if (w) send_msg(w, m);
}

/* The leader: another node's worker wrote its shard. */
static void cluster_ckpt_done(void *arg, const msg_ckpt_done *done) {
    supervisor *s = arg;
    ckpt_coord_on_done(s->ckpt, done->rank, done);
}

/* The leader: what a follower's signal or status socket asked for, for the whole job. */
static void cluster_ckpt_request(void *arg, const msg_ckpt_request *req) {
    supervisor *s = arg;
    if (!strcmp(req->kind, "checkpoint")) request_checkpoint(s, req->why);
    else if (!strcmp(req->kind, "stop")) request_stop(s, req->why, 0);
    else stop_for_sigterm(s, strncmp(req->why, "SIGUSR1", 7) ? SIGTERM : SIGUSR1, req->why); /* "SIG... on node N" */
}

static const char *cluster_state(void *arg) { return phase_name(arg); }

static json_t *cluster_progress(void *arg) {
    const supervisor *s = arg;
    return s->last_metrics ? json_incref(s->last_metrics) : NULL;
}

static json_t *cluster_ranks(void *arg) {
    const supervisor *s = arg;
    json_t *raw = local_rank_rows(s);
    json_t *rows = status_rank_rows(raw, s->job.runtime.backend == JOB_BACKEND_CUDA);
    json_decref(raw);
    return rows;
}

/* ---- a worker's heartbeats and network check (handle_message) ---- */

/* A rank's network (its ready heartbeat): logged, kept for the status, and checked against
 * the fabric found and fabric.min_busbw_gbps.  Non-zero when the job cannot go on. */
static int check_net(supervisor *s, worker *w, const msg_net *net) {
    w->has_net = 1;
    w->net = *net;
    const char *t = net->transport[0] ? net->transport : "unknown";
    if (net->measured)
        log_event(w->rank, "network check: %.2f GB/s of bus bandwidth (all_reduce over %d ranks), transport %s",
                  net->busbw_gbps, s->opt->workers * cluster_nodes(s->opt->cluster), t);
    else
        log_event(w->rank, "transport %s", t);
    const char *kind = s->opt->fabric_kind ? s->opt->fabric_kind : "none";
    if (nccl_transport_is_socket(net->transport) && strcmp(kind, "none") != 0) {
        record_failure(s, FAILURE_PERMANENT, "rank %d: NCCL chose TCP sockets although this node has %s (%s): "
                       "check the NCCL net plugin and NCCL_* settings, or NCCL_DEBUG_FILE's log", w->rank,
                       !strcmp(kind, "efa") ? "EFA" : "InfiniBand", s->opt->fabric_found);
        return -1;
    }
    double floor = s->job.fabric.min_busbw_gbps;
    if (net->measured && floor > 0 && net->busbw_gbps < floor) {
        record_failure(s, FAILURE_PERMANENT, "rank %d on node %d: the network check measured %.2f GB/s of bus "
                       "bandwidth, below fabric.min_busbw_gbps = %g", w->rank, cluster_node(s->opt->cluster),
                       net->busbw_gbps, floor);
        return -1;
    }
    return 0;
}

static void on_heartbeat(supervisor *s, worker *w, const msg_heartbeat *h) {
    if (h->has_mem_bytes) w->mem_bytes = h->mem_bytes;
    if (h->has_progress && h->progress != w->work_done) {
        w->work_done = h->progress;
        w->work_step = h->has_step ? h->step : 0;
        w->work_at = clock_now_s();
    }
    if (h->has_timing) {
        w->has_timing = 1;
        w->timing = h->timing;
    }
    if (h->has_coll && (!w->has_coll || memcmp(&h->coll, &w->coll, sizeof h->coll) != 0)) {
        w->has_coll = 1;
        w->coll = h->coll;
        w->coll_changed_at = clock_now_s();
    }
    if (!h->ready || w->ready) return;
    w->ready = 1;
    if (h->has_net && check_net(s, w, &h->net)) return;
    if (++s->n_ready < s->opt->workers || s->phase != PHASE_SETUP) return;
    if (multi_node(s)) cluster_ready(s->opt->cluster); /* the leader starts every node */
    else start_training(s);
}

/* ---- a worker's messages and connection (the loop: on_readable, on_connection_event) ---- */

static void handle_message(worker *w, const msg_frame *frame) {
    supervisor *s = w->sup;
    static msg m;
    errbuf err;
    if (msg_decode(frame, &m, &err)) {
        fail(s, "rank %d: bad message: %s", w->rank, err.msg);
        return;
    }
    switch (m.type) {
    case MSG_HELLO: send_config(s, w); break;
    case MSG_NCCL_ID: relay_nccl_id(s, w, &m); break;
    case MSG_ADDR:
        if (w->addr[0]) {
            fail(s, "rank %d sent a second ADDR message", w->rank);
            break;
        }
        strcpy(w->addr, m.u.addr.addr);
        if (++s->n_addr == s->opt->workers) collect_addrs(s);
        break;
    case MSG_HEARTBEAT: on_heartbeat(s, w, &m.u.heartbeat); break;
    case MSG_METRICS:
        if (w->rank == 0) {
            ckpt_coord_on_metrics(s->ckpt, &m.u.metrics);
            note_rank0_metrics(s, &m);
        }
        on_metrics(s, w, &m);
        break;
    case MSG_SAMPLE:
        if (w->rank == 0) on_sample(s, &m);
        else fail(s, "rank %d sent a SAMPLE (rank 0 reports them)", w->rank);
        break;
    case MSG_CKPT_DONE:
        if (m.u.ckpt_done.rank != w->rank) fail(s, "rank %d sent a CKPT_DONE of rank %d", w->rank, m.u.ckpt_done.rank);
        else on_ckpt_done(s, &m);
        break;
    case MSG_FATAL:
        w->reported = 1;
        record_failure(s, m.u.fatal.permanent ? FAILURE_PERMANENT : FAILURE_REPORTED, "rank %d failed: %s",
                       w->rank, m.u.fatal.message);
        break;
    default:
        fail(s, "rank %d sent an unexpected %s message", w->rank, msg_type_name(m.type));
    }
    msg_free(&m);
}

static void on_readable(struct bufferevent *bev, void *arg) {
    worker *w = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    unsigned char chunk[65536];
    errbuf err;
    int n;
    w->last_seen = clock_now_s();
    while ((n = evbuffer_remove(in, chunk, sizeof chunk)) > 0) {
        if (msg_decoder_feed(&w->dec, chunk, (size_t)n, &err)) {
            fail(w->sup, "rank %d: %s", w->rank, err.msg);
            close_connection(w);
            maybe_finish(w);
            return;
        }
    }
    msg_frame frame;
    int got = 0;
    while (w->bev && (got = msg_decoder_next(&w->dec, &frame, &err)) == 1) {
        handle_message(w, &frame);
        msg_frame_free(&frame);
    }
    if (w->bev && got < 0) {
        fail(w->sup, "rank %d: protocol error: %s", w->rank, err.msg);
        close_connection(w);
        maybe_finish(w);
    }
}

static void on_connection_event(struct bufferevent *bev, short events, void *arg) {
    (void)bev;
    worker *w = arg;
    if (!(events & (BEV_EVENT_EOF | BEV_EVENT_ERROR))) return;
    on_readable(w->bev, w);
    if (!w->bev) return;
    if (msg_decoder_buffered(&w->dec))
        log_event(w->rank, "connection closed in the middle of a message");
    close_connection(w);
    maybe_finish(w);
}

/* ---- spawning a worker (supervisor_run) ---- */

/* Forks one worker with its end of a socketpair as WORKER_CTL_FD.  Only the main thread
 * forks: PR_SET_PDEATHSIG follows the thread that forked. */
static int spawn_worker(supervisor *s, worker *w, errbuf *err) {
    int sv[2];
    int images = has_images(s) ? 2 * s->opt->memory->workers : 0;
    int *parked = malloc((size_t)(images + 1) * sizeof *parked); /* the child's: no malloc after fork */
    if (!parked) return errf(err, "out of memory");
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        free(parked);
        return errf(err, "socketpair: %s", strerror(errno));
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        free(parked);
        return errf(err, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        /* The child: die with the daemon, even if it died before the next line. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* Park every descriptor above the targets first, so that no placement can clobber
         * another's source; dup2 leaves the placed copies open across exec. */
        int above = WORKER_MEMORY_FD + images + 1;
        int ctl = fcntl(sv[1], F_DUPFD_CLOEXEC, above);
        int model = s->model_fd >= 0 ? fcntl(s->model_fd, F_DUPFD_CLOEXEC, above) : -1;
        for (int i = 0; i < images; i++)
            if ((parked[i] = fcntl(s->opt->memory->fd[i], F_DUPFD_CLOEXEC, above)) < 0) _exit(126);
        if (ctl < 0 || dup2(ctl, WORKER_CTL_FD) < 0 || (s->model_fd >= 0 && model < 0) ||
            (model >= 0 && dup2(model, WORKER_MODEL_FD) < 0))
            _exit(126);
        for (int i = 0; i < images; i++)
            if (dup2(parked[i], WORKER_MEMORY_FD + i) < 0) _exit(126);
        execl(s->opt->worker_path, "fsdp-worker", "--ctl-fd", "3", (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    free(parked);
    w->pid = pid;
    w->last_seen = clock_now_s();
    w->mem_bytes = -1;
    msg_decoder_init(&w->dec);
    evutil_make_socket_nonblocking(sv[0]);
    w->bev = bufferevent_socket_new(s->base, sv[0], BEV_OPT_CLOSE_ON_FREE);
    if (!w->bev) {
        close(sv[0]);
        return errf(err, "rank %d: cannot create its connection", w->rank);
    }
    bufferevent_setcb(w->bev, on_readable, NULL, on_connection_event, w);
    bufferevent_enable(w->bev, EV_READ | EV_WRITE);
    log_event(w->rank, "started, pid %d", (int)pid);
    return 0;
}

/* ---- signals and timers ---- */

static void on_sigchld(evutil_socket_t sig, short what, void *arg) {
    (void)sig, (void)what;
    supervisor *s = arg;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int r = 0; r < s->opt->workers; r++) {
            worker *w = &s->workers[r];
            if (w->pid != pid) continue;
            w->exited = 1;
            w->status = status;
            maybe_finish(w);
        }
    }
}

/* SIGINT: a stop (STOP, then SIGKILL after stop_grace_s); a second one: SIGKILL now. */
static void on_sigint(evutil_socket_t sig, short what, void *arg) {
    (void)sig, (void)what;
    supervisor *s = arg;
    if (++s->sigint_count >= 2) {
        log_event(-1, "second SIGINT: stopping at once");
        kill_all(s);
        return;
    }
    if (!s->signalled) s->signalled = SIGINT;
    begin_stop(s, "SIGINT");
}

/* SIGTERM (preemption, DESIGN.md: Signals and SLURM), and SIGUSR1 where it means requeue
 * (requeue_on_usr1): a synchronous checkpoint of the step in progress, then stop; whatever is
 * still running runtime.stop_grace_s after it is killed (SLURM's GraceTime ends in SIGKILL
 * anyway).  Either signal again changes nothing: the commit goes on.  On several nodes the
 * leader does it for every node: a follower forwards it, and the leader treats a follower's
 * as its own. */
static void stop_for_sigterm(supervisor *s, int sig, const char *why) {
    if (s->signalled == SIGTERM || s->signalled == SIGUSR1) {
        log_event(-1, "%s%s: ignored, the stop goes on (at most runtime.stop_grace_s = %d s)", why,
                  strcmp(why, "SIGTERM") && strcmp(why, "SIGUSR1") ? " too" : " again",
                  s->job.runtime.stop_grace_s);
        return;
    }
    if (!s->signalled) s->signalled = sig;
    struct timeval grace = {s->job.runtime.stop_grace_s, 0};
    evtimer_add(s->term_deadline, &grace);
    if (s->phase == PHASE_TRAINING || (is_follower(s) && s->phase == PHASE_SETUP)) {
        log_event(-1, "%s: a synchronous checkpoint, then stopping (at most %d s)", why,
                  s->job.runtime.stop_grace_s);
        request_stop(s, why, 1);
        return;
    }
    begin_stop(s, why);
}

static void on_sigterm(evutil_socket_t sig, short what, void *arg) {
    (void)sig, (void)what;
    stop_for_sigterm(arg, SIGTERM, "SIGTERM");
}

static void on_term_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    supervisor *s = arg;
    int unsaved = s->stop_request && !s->stop_settled;
    log_event(-1, "SIGTERM: runtime.stop_grace_s = %d s are over%s: killing the workers",
              s->job.runtime.stop_grace_s, unsaved ? " before the checkpoint committed" : "");
    kill_all(s);
}

/* SIGUSR1 (SLURM's time-limit warning, or a user): a checkpoint now and training goes on, or
 * (requeue_on_usr1) a stop for a requeue. */
static void on_checkpoint_signal(evutil_socket_t sig, short what, void *arg) {
    (void)sig, (void)what;
    supervisor *s = arg;
    if (requeue_on_usr1(&s->job)) {
        stop_for_sigterm(s, SIGUSR1, "SIGUSR1");
        return;
    }
    long long id = request_checkpoint(s, "SIGUSR1");
    if (id > 0) log_event(-1, "SIGUSR1: checkpoint requested (request %lld)", id);
    else if (id == 0) log_event(-1, "SIGUSR1: not training yet, no checkpoint to take");
}

/* The leader, at every heartbeat check while training: every rank's step times so far
 * (this node's from their heartbeats, the others' from their nodes') to the stragglers' watch,
 * what it finds logged. */
static void watch_stragglers(supervisor *s) {
    if (!s->stragglers || s->phase != PHASE_TRAINING) return;
    json_t *now = json_object();
    add_ranks(s, now);
    json_t *news = straggler_watch_look(s->stragglers, json_object_get(now, "ranks"));
    json_decref(now);
    size_t i;
    json_t *line;
    json_array_foreach(news, i, line) log_event(-1, "%s", json_string_value(line));
    json_decref(news);
}

static void on_heartbeat_check(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    supervisor *s = arg;
    int hb = s->job.runtime.heartbeat_s;
    double limit = 3.0 * hb > hb + 10.0 ? 3.0 * hb : hb + 10.0, now = clock_now_s();
    /* the stall watch: a rank alive (heartbeats) whose training stopped moving */
    int stall = job_stall_timeout_s(&s->job);
    for (int r = 0; r < s->opt->workers; r++) {
        worker *w = &s->workers[r];
        if (!w->exited && w->bev && now - w->last_seen > limit)
            fail(s, "rank %d sent nothing for %.0f s (heartbeat every %d s)", r, now - w->last_seen, hb);
        else if (!w->exited && s->phase == PHASE_TRAINING && w->work_done > 0 && now - w->work_at > stall)
            fail(s, "rank %d made no progress for %.0f s after step %lld (runtime.stall_timeout_s %d s), "
                    "though its heartbeats still come: a GPU kernel or a call that never returns",
                 w->rank, now - w->work_at, w->work_step, stall);
    }
    watch_stragglers(s);
}

/* ---- set-up and tear-down ---- */

static int open_metrics(supervisor *s, errbuf *err) {
    const char *path = s->job.runtime.metrics;
    int fd = file_open_append(path, err); /* a FIFO there would block the loop, signals and all */
    if (fd < 0) return -1;
    s->metrics = fdopen(fd, "a");
    if (!s->metrics) {
        close(fd);
        return errf(err, "%s: fdopen: %s", path, strerror(errno));
    }
    return 0;
}

/* This run's TensorBoard file, on the leader (where rank 0's METRICS arrive). */
static int open_tensorboard(supervisor *s, errbuf *err) {
    if (!(s->job.runtime.log_to & JOB_LOG_TENSORBOARD) || is_follower(s)) return 0;
    int64_t first = s->ckpt_start.resume_dir[0] ? s->ckpt_start.resume_step + 1 : 1;
    if (tb_writer_open(&s->tb, &s->job, s->opt->restart, first, err)) return -1;
    log_event(-1, "TensorBoard events in %s", tb_writer_path(s->tb));
    return 0;
}

static int setup_events(supervisor *s, errbuf *err) {
    s->base = event_base_new();
    if (!s->base) return errf(err, "cannot create the event loop");
    s->sigchld = evsignal_new(s->base, SIGCHLD, on_sigchld, s);
    s->sigint = evsignal_new(s->base, SIGINT, on_sigint, s);
    s->sigterm = evsignal_new(s->base, SIGTERM, on_sigterm, s);
    s->sigusr1 = evsignal_new(s->base, SIGUSR1, on_checkpoint_signal, s);
    s->term_deadline = evtimer_new(s->base, on_term_deadline, s);
    s->grace = evtimer_new(s->base, on_grace_expired, s);
    s->heartbeat = event_new(s->base, -1, EV_PERSIST, on_heartbeat_check, s);
    struct timeval every = {s->job.runtime.heartbeat_s, 0};
    if (!s->sigchld || !s->sigint || !s->sigterm || !s->sigusr1 || !s->term_deadline ||
        !s->grace || !s->heartbeat || evsignal_add(s->sigchld, NULL) ||
        evsignal_add(s->sigint, NULL) || evsignal_add(s->sigterm, NULL) ||
        evsignal_add(s->sigusr1, NULL) || event_add(s->heartbeat, &every))
        return errf(err, "cannot set up the event loop's signals and timers");
    if (requeue_take_early_usr1()) raise(SIGUSR1); /* to the loop, now that it listens */
    return 0;
}

static void teardown(supervisor *s) {
    status_server_free(s->status);
    json_decref(s->last_metrics);
    json_decref(s->behind);
    replica_source_stop(s->source);
    free(s->replicas.addrs);
    straggler_watch_free(s->stragglers);
    ckpt_coord_free(s->ckpt);
    json_decref(s->ckpt_start.model_config);
    for (int r = 0; s->workers && r < s->opt->workers; r++) {
        close_connection(&s->workers[r]);
        msg_decoder_free(&s->workers[r].dec);
    }
    cluster_detach(s->opt->cluster);
    struct event *events[] = {s->sigchld, s->sigint,        s->sigterm,  s->sigusr1,
                              s->term_deadline, s->grace, s->heartbeat};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
        if (events[i]) event_free(events[i]);
    if (s->base) event_base_free(s->base);
    if (s->metrics) fclose(s->metrics);
    if (s->samples) fclose(s->samples);
    tb_writer_close(s->tb);
    if (s->model_fd >= 0) close(s->model_fd);
    free(s->workers);
}

/* The checkpoint directory and the resume: the leader (or a lone node) prepares them and
 * sends the other nodes its plan, which they adopt.  Before the links go on the loop. */
static int plan_checkpoints(supervisor *s, errbuf *err) {
    cluster *c = s->opt->cluster;
    int world = s->opt->workers * cluster_nodes(c);
    if (is_follower(s)) {
        msg_plan plan;
        if (cluster_recv_plan(c, &plan, err)) return -1;
        s->replicas = plan.replicas;
        ckpt_memory memory = {.step = plan.memory_step, .images = s->opt->memory, .node = cluster_node(c), .world = world};
        return ckpt_adopt(&s->job, plan.attempt, plan.resume_dir, &memory, &s->ckpt_start, err);
    }
    if (has_images(s) && multi_node(s) && cluster_replica_targets(c, &s->replicas, err)) return -1;
    ckpt_memory memory = {.step = has_images(s) ? cluster_memory_step(c) : -1, .images = s->opt->memory, .world = world};
    int rc = ckpt_prepare(&s->job, s->opt->data_identity, &memory, &s->ckpt_start, err);
    if (!multi_node(s)) return rc;
    msg_plan plan = {.attempt = rc ? 1 : s->ckpt_start.attempt, .memory_step = -1, .has_replicas = s->replicas.n > 0,
                     .replicas = s->replicas};
    if (rc) snprintf(plan.error, sizeof plan.error, "%s", err->msg);
    else if (s->ckpt_start.from_memory) plan.memory_step = s->ckpt_start.resume_step;
    else snprintf(plan.resume_dir, sizeof plan.resume_dir, "%s", s->ckpt_start.resume_dir);
    errbuf why;
    if (cluster_send_plan(c, &plan, &why)) {
        if (rc == 0) errf(err, "%s", why.msg);
        return -1;
    }
    return rc;
}

/* The copies of this node's in-memory checkpoint images to the spares, when there are some. */
static int start_replicas(supervisor *s, errbuf *err) {
    unsigned char secret[MSG_SECRET_BYTES];
    s->sealed_step = -1;
    if (hex_decode(cluster_secret_hex(s->opt->cluster), secret, sizeof secret)) return errf(err, "a malformed secret");
    if (s->replicas.n)
        log_event(-1, "in-memory checkpoints copied to %d spare(s), the first %s", s->replicas.n, s->replicas.addrs[0]);
    return replica_source_start(&s->source, s->opt->memory, cluster_node(s->opt->cluster), cluster_nodes(s->opt->cluster),
                                local_files(s), &s->replicas, secret, sizeof secret, err);
}

/* The leader's stragglers' watch, when there are ranks to compare and the job asks for it. */
static int setup_stragglers(supervisor *s, errbuf *err) {
    int world = s->opt->workers * cluster_nodes(s->opt->cluster);
    if (is_follower(s) || world < 2 || s->job.runtime.straggler_factor == 0) return 0;
    s->stragglers = straggler_watch_new(s->job.runtime.straggler_factor, s->job.runtime.straggler_steps);
    return s->stragglers ? 0 : errf(err, "out of memory");
}

/* The job resolved again for what the checkpoint fixed, and the leader's coordinator. */
static int setup_checkpoints(supervisor *s, errbuf *err) {
    /* A resume takes global_batch from the checkpoint: grad_accum follows it. */
    int world = s->opt->workers * cluster_nodes(s->opt->cluster);
    if (job_resolve(&s->job, world, err) || job_validate(&s->job, world, err)) return -1;
    if (is_follower(s)) return 0;
    ckpt_coord_options copt = {.job = &s->job, .world = world, .attempt = s->ckpt_start.attempt,
                               .model_config = s->ckpt_start.model_config,
                               .base_fingerprint = s->ckpt_start.base_fingerprint,
                               .identity = &s->ckpt_start.identity, .base = s->base,
                               .hooks = {.arg = s, .send = ckpt_send, .broadcast = ckpt_broadcast,
                                         .fatal = ckpt_fatal, .fatal_permanent = ckpt_fatal_permanent,
                                         .settled = ckpt_settled}};
    return ckpt_coord_new(&s->ckpt, &copt, err);
}

/* The model, once for the node, in sealed shared memory the workers copy their slices from;
 * not needed when the workers of a full fine-tune resume from a checkpoint, but for DPO (an
 * adapter job's checkpoint holds no base, a full DPO's no reference: they read them from it
 * again).  Named after the job, the restart and the node, as DESIGN.md asks of everything a
 * requeued job could meet again. */
/* Before anything is loaded: the job's worker must fit its GPU, or runtime.gpu_memory_limit
 * (model/step_plan.h), else the job is refused with what it needs and what would fit. */
static int check_fits(supervisor *s, model_image_quant q, errbuf *err) {
    int cuda = s->job.runtime.backend == JOB_BACKEND_CUDA;
    int world = s->opt->workers * cluster_nodes(s->opt->cluster);
    return step_plan_admit(&s->job, &s->ckpt_start.model, world, q, cuda ? 2 : 4,
                           cuda ? k_cuda_device_memory(0) : 0, PLAN_CONTEXT_BYTES, err);
}

/* The resolved job and what fsdpd derived, before the model loads (daemon/run_report.h): in the
 * leader's log and output.dir. */
static int report_start(supervisor *s, errbuf *err) {
    run_record *r = s->opt->record;
    if (!r) return 0;
    if (run_report_derive(r, &s->job, &s->ckpt_start.model, s->ckpt_start.model_config, s->ckpt_start.resume_dir,
                          s->ckpt_start.resume_step, cluster_nodes(s->opt->cluster), s->opt->workers,
                          s->opt->restart, err))
        return errprefix(err, "the job's derived values");
    return is_follower(s) ? 0 : run_report_start(r, &s->job, err);
}

static int setup_model(supervisor *s, errbuf *err) {
    s->model_fd = -1;
    if (s->ckpt_start.resume_dir[0] && s->job.train.type == JOB_TRAIN_FULL &&
        s->job.train.objective != JOB_OBJECTIVE_DPO)
        return check_fits(s, MODEL_IMAGE_PLAIN, err);
    const job_config *j = &s->job;
    llama_layout lo;
    if (llama_layout_init(&lo, &s->ckpt_start.model, err)) return -1;
    const char *job_id = getenv("SLURM_JOB_ID"), *restart = getenv("SLURM_RESTART_COUNT");
    char name[128];
    int node = cluster_node(s->opt->cluster);
    if (job_id) snprintf(name, sizeof name, "fsdpd-model-%s-r%s-n%d", job_id, restart ? restart : "0", node);
    else snprintf(name, sizeof name, "fsdpd-model-local-%d-r0-n%d", (int)getpid(), node);
    size_t bytes;
    double t0 = clock_now_s();
    model_image_quant q;
    int bnb;
    int rc = model_shm_quant(j, s->ckpt_start.model_config, &q, &bnb, err);
    if (rc == 0 && check_fits(s, j->train.type == JOB_TRAIN_FULL ? MODEL_IMAGE_PLAIN : q, err)) {
        llama_layout_free(&lo);
        return -1;
    }
    if (rc == 0) rc = model_shm_create(j, &lo, q, bnb, name, &s->model_fd, &bytes, err);
    llama_layout_free(&lo);
    if (rc) return errprefix(err, "loading the model");
    log_event(-1, "model in shared memory: %.1f MB (%s%s), %.1f s", bytes / 1e6,
              j->model.init == JOB_INIT_RANDOM ? "random init" : j->model.path,
              q == MODEL_IMAGE_PLAIN ? "" : bnb ? ", NF4 as saved" : ", quantized to NF4",
              clock_now_s() - t0);
    return 0;
}

int supervisor_run(const supervisor_options *opt, errbuf *err) {
    supervisor s = {.opt = opt, .job = *opt->job, .model_fd = -1,
                    .fabric = opt->workers * cluster_nodes(opt->cluster) == 1 ? "none" : NULL};
    s.workers = calloc((size_t)opt->workers, sizeof *s.workers);
    int rc = s.workers ? 0 : errf(err, "out of memory");
    cluster_hooks links = {.arg = &s, .peers = send_peers, .nccl_id = send_nccl_id, .start = start_training,
                           .stop = cluster_stopped, .to_workers = cluster_to_workers,
                           .ckpt_done = cluster_ckpt_done, .ckpt_request = cluster_ckpt_request,
                           .state = cluster_state, .ranks = cluster_ranks, .progress = cluster_progress};
    if (rc == 0) rc = setup_events(&s, err);
    if (rc == 0) rc = plan_checkpoints(&s, err);
    if (rc == 0) rc = cluster_attach(opt->cluster, s.base, &links, err);
    status_job_hooks hooks = {.arg = &s, .status = status_of, .request_checkpoint = status_request_checkpoint,
                              .request_stop = status_request_stop};
    if (rc == 0) rc = status_server_open(&s.status, s.base, &hooks, &s.job, cluster_node(opt->cluster), err);
    if (rc == 0) rc = setup_checkpoints(&s, err);
    if (rc == 0) rc = setup_stragglers(&s, err);
    if (rc == 0)
        rc = has_images(&s) ? memory_ckpt_slots(&s.job, &s.ckpt_start.model, opt->memory,
                                                opt->workers * cluster_nodes(opt->cluster), &s.memory_slots, err)
                            : 0;
    if (rc == 0 && s.memory_slots) rc = start_replicas(&s, err);
    if (rc == 0) rc = report_start(&s, err);
    if (rc == 0) rc = open_tensorboard(&s, err);
    if (rc == 0) rc = setup_model(&s, err);
    if (rc == 0) rc = open_metrics(&s, err);
    for (int r = 0; rc == 0 && r < opt->workers; r++) {
        s.workers[r] = (worker){.sup = &s, .rank = cluster_node(opt->cluster) * opt->workers + r};
        rc = spawn_worker(&s, &s.workers[r], err);
        if (rc) {
            fail(&s, "cannot start rank %d: %s", r, err->msg);
            /* The ones already running are stopped by the loop below. */
            s.n_finished += opt->workers - r;
            rc = 0;
            break;
        }
    }
    /* Nothing before the workers (the job, the checkpoint to resume, the model, the metrics
     * file) gets better by trying again. */
    if (rc) rc = SUPERVISOR_FAILED_PERMANENTLY;
    if (rc == 0 && s.n_finished < opt->workers) event_base_dispatch(s.base);
    int unfinished = s.ckpt ? ckpt_coord_finish(s.ckpt) : 0;
    if (rc == 0 && s.signalled) {
        const char *name = s.signalled == SIGINT ? "SIGINT" : s.signalled == SIGTERM ? "SIGTERM" : "SIGUSR1";
        errf(err, "stopped by signal %s", name);
        rc = s.signalled == SIGINT ? SUPERVISOR_SIGNALLED : SUPERVISOR_PREEMPTED;
    } else if (rc == 0 && s.failed) {
        errf(err, "%s", s.reason.msg);
        rc = s.reason_permanent ? SUPERVISOR_FAILED_PERMANENTLY : SUPERVISOR_FAILED;
    } else if (rc == 0 && unfinished) rc = errf(err, "the final checkpoint was not committed");
    teardown(&s);
    return rc;
}
