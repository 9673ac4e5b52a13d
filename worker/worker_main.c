/* fsdp-worker: one rank of a job.  fsdpd starts it with its end of a socketpair as a file
 * descriptor (--ctl-fd); everything else — the job, the rank, the peers — comes over that
 * connection (proto/ctl.h).
 *
 * Signals: SLURM signals every process of a step, but the daemon decides, so SIGTERM,
 * SIGINT and SIGUSR1 are ignored here; the worker stops on a STOP message, dies with its
 * daemon (PR_SET_PDEATHSIG, set by fsdpd before exec) and exits when its connection closes.
 *
 * Checkpoints: CKPT_BEGIN {"request": id} asks for a checkpoint at the next step boundary
 * (worker/train.h says how the ranks agree on the step); with "stop": true (SIGTERM) for a
 * synchronous one after the step in progress, and a stop after it.  CKPT_ABORT {"step",
 * "attempt"} stops that save's writing; each written (or failed, or aborted) shard file is reported with
 * CKPT_DONE {"step", "attempt", "rank", "sync", "ok", "aborted", "error", "file", "bytes",
 * "header_crc32c", "stage_s", "write_s"}, rank 0's also with "optimizer_step", "tokens_seen"
 * and the layout ("units") for the manifest.  A METRICS message announces each save before
 * its files are written: "checkpoint": {"step", "attempt", "mode": async|sync|skipped,
 * "request"}.
 *
 * A FATAL {"message"} carries "permanent": true when no restart can cure the error: the job
 * (CONFIG) does not validate, or loading the model, the checkpoint or the data failed.
 *
 * Test-only fault hooks: FSDP_TEST_WORKER_FAULT="RANK:ACTION:STEP[,...]" with ACTION
 *   exit          exit with status 3 after step STEP;
 *   hang_on_stop  when asked to stop (or when training ends), hang instead: fsdpd must
 *                 kill it;
 * and FSDP_TEST_CKPT_FAULT (worker/ckpt_writer.h). */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "proto/ctl.h"
#include "proto/job.h"
#include "worker/ckpt_writer.h"
#include "worker/comm.h"
#include "worker/comm_nccl.h"
#include "worker/train.h"

#define SETUP_TIMEOUT_MS 120000

typedef struct worker {
    int fd;
    pthread_mutex_t send_lock;
    int rank, world, local_rank;
    int model_fd; /* fsdpd's model image, inherited; -1 when resuming from a checkpoint */
    char bind_host[256];
    unsigned char secret[COMM_SECRET_BYTES];
    job_config job;
    atomic_int stop_requested; /* 0, TRAIN_STOP or TRAIN_STOP_SAVE */
    atomic_long step;
    atomic_llong mem_bytes;    /* context memory in use after the last step (-1: none yet) */
    atomic_llong ckpt_request; /* the newest checkpoint request received */
    int ckpt_attempt;
    char resume_dir[JOB_PATH_MAX];
    ckpt_writer writer;
    pthread_mutex_t writer_lock; /* the control thread uses the writer only while writer_live */
    int writer_live;
    int fault_step;
    char fault_action[32];
    int permanent; /* the error is one no restart can cure */
} worker;

static int send_json(worker *w, ctl_type type, json_t *body, errbuf *err) {
    if (!body) return errf(err, "out of memory building %s", ctl_type_name(type));
    pthread_mutex_lock(&w->send_lock);
    int rc = ctl_send_json(w->fd, type, body, err);
    pthread_mutex_unlock(&w->send_lock);
    json_decref(body);
    return rc;
}

/* Receives a message of the expected type; a STOP instead means the job ended first. */
static int expect(worker *w, ctl_type type, json_t **body, errbuf *err) {
    ctl_msg m;
    if (ctl_recv(w->fd, &m, SETUP_TIMEOUT_MS, err)) return errprefix(err, "waiting for %s", ctl_type_name(type));
    if (m.type != type) {
        int stopped = m.type == CTL_STOP;
        errf(err, "expected %s, got %s", ctl_type_name(type), ctl_type_name(m.type));
        ctl_msg_free(&m);
        return stopped ? 1 : -1;
    }
    int rc = ctl_msg_json(&m, body, err);
    ctl_msg_free(&m);
    return rc;
}

static int parse_hex(const char *hex, unsigned char *out, size_t n) {
    if (!hex || strlen(hex) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

static int read_config(worker *w, errbuf *err) {
    json_t *cfg;
    int rc = expect(w, CTL_CONFIG, &cfg, err);
    if (rc) return rc;
    const char *job_text = json_string_value(json_object_get(cfg, "job"));
    const char *host = json_string_value(json_object_get(cfg, "bind_host"));
    const char *resume = json_string_value(json_object_get(cfg, "resume_dir"));
    w->rank = (int)json_integer_value(json_object_get(cfg, "rank"));
    w->local_rank = (int)json_integer_value(json_object_get(cfg, "local_rank"));
    json_t *model_fd = json_object_get(cfg, "model_fd");
    w->model_fd = json_is_integer(model_fd) ? (int)json_integer_value(model_fd) : -2;
    w->world = (int)json_integer_value(json_object_get(cfg, "world"));
    w->ckpt_attempt = (int)json_integer_value(json_object_get(cfg, "ckpt_attempt"));
    rc = -1;
    if (!job_text || !host || strlen(host) >= sizeof w->bind_host || w->world < 1 ||
        w->rank < 0 || w->rank >= w->world || w->local_rank < 0 || w->model_fd < -1 ||
        w->ckpt_attempt < 1 || !resume ||
        strlen(resume) >= sizeof w->resume_dir ||
        parse_hex(json_string_value(json_object_get(cfg, "secret")), w->secret, COMM_SECRET_BYTES))
        errf(err, "malformed CONFIG message");
    else if (job_parse(&w->job, job_text, strlen(job_text), err) == 0 &&
             job_validate(&w->job, w->world, err) == 0)
        rc = 0;
    if (host) snprintf(w->bind_host, sizeof w->bind_host, "%s", host);
    if (rc == 0) strcpy(w->resume_dir, resume);
    json_decref(cfg);
    return rc;
}

/* TCP rings: publish our address, learn theirs, connect. */
static int connect_tcp(worker *w, comm **out, errbuf *err) {
    comm_listener l;
    if (comm_tcp_listen(&l, w->bind_host, err)) return -1;
    json_t *peers = NULL;
    int rc = send_json(w, CTL_ADDR, json_pack("{s:s}", "addr", l.addr), err);
    if (rc == 0) rc = expect(w, CTL_PEERS, &peers, err);
    json_t *addrs = json_object_get(peers, "addrs");
    if (rc == 0 && (!json_is_array(addrs) || json_array_size(addrs) != (size_t)w->world))
        rc = errf(err, "malformed PEERS message");
    const char **table = calloc((size_t)w->world, sizeof *table);
    if (rc == 0 && !table) rc = errf(err, "out of memory");
    for (int r = 0; rc == 0 && r < w->world; r++)
        if (!(table[r] = json_string_value(json_array_get(addrs, (size_t)r))))
            rc = errf(err, "malformed PEERS message");
    if (rc == 0) {
        comm_options opt = {.timeout_s = w->job.runtime.comm_timeout_s, .init_timeout_s = 60};
        memcpy(opt.secret, w->secret, sizeof opt.secret);
        comm_rank_table t = {.world = w->world, .addr = table};
        rc = comm_init(out, &opt, w->rank, &t, &l, err);
    }
    comm_listener_close(&l);
    free(table);
    json_decref(peers);
    return rc;
}

#ifdef FSDP_HAVE_CUDA
static int send_raw(worker *w, ctl_type type, const void *body, size_t len, errbuf *err) {
    pthread_mutex_lock(&w->send_lock);
    int rc = ctl_send(w->fd, type, body, len, err);
    pthread_mutex_unlock(&w->send_lock);
    return rc;
}

/* NCCL: global rank 0 makes the unique id, fsdpd relays it to every rank. */
static int connect_nccl(worker *w, kctx *ctx, comm **out, errbuf *err) {
    unsigned char id[COMM_NCCL_ID_BYTES];
    if (w->rank == 0 && (comm_nccl_make_id(id, err) || send_raw(w, CTL_NCCL_ID, id, sizeof id, err)))
        return -1;
    ctl_msg m;
    if (ctl_recv(w->fd, &m, SETUP_TIMEOUT_MS, err)) return errprefix(err, "waiting for NCCL_ID");
    int ok = m.type == CTL_NCCL_ID && m.len == sizeof id;
    if (ok) memcpy(id, m.body, sizeof id);
    else errf(err, "expected a %zu-byte NCCL_ID, got %s (%u bytes)", sizeof id, ctl_type_name(m.type), m.len);
    ctl_msg_free(&m);
    if (!ok) return -1;
    comm_options opt = {.timeout_s = w->job.runtime.comm_timeout_s, .init_timeout_s = 120};
    return comm_nccl_init(out, &opt, w->rank, w->world, id, ctx, err);
}
#endif

/* Joins the peers: NCCL when every rank has a GPU of its own, else TCP rings (through host
 * memory when the buffers are on a GPU). */
static int connect_peers(worker *w, kctx *ctx, int gpus, comm **out, errbuf *err) {
    *out = NULL;
    if (w->world == 1) return 0;
#ifdef FSDP_HAVE_CUDA
    if (ctx->backend == K_CUDA && w->world <= gpus) return connect_nccl(w, ctx, out, err);
#else
    (void)gpus;
#endif
    if (connect_tcp(w, out, err)) return -1;
    if (ctx->backend == K_CUDA && comm_stage_through_host(out, ctx, err)) {
        comm_destroy(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

/* The kernels context: the CPU, or GPU local_rank mod the visible GPUs.  A CPU worker does
 * not touch CUDA at all (its runtime costs ~80 MB of memory even without a device). */
static int open_context(worker *w, kctx *ctx, int *gpus, errbuf *err) {
    *gpus = 0;
    if (w->job.runtime.backend != JOB_BACKEND_CUDA) return kctx_init(ctx, K_CPU, 0, err);
    *gpus = k_cuda_available();
    if (*gpus < 1) return errf(err, "runtime.backend is cuda but this worker sees no GPU");
    return kctx_init(ctx, K_CUDA, w->local_rank % *gpus, err);
}

static void *heartbeat_loop(void *arg) {
    worker *w = arg;
    for (;;) {
        sleep((unsigned)w->job.runtime.heartbeat_s);
        errbuf err;
        long long mem = atomic_load(&w->mem_bytes);
        json_t *beat = json_pack("{s:I}", "step", (json_int_t)atomic_load(&w->step));
        if (beat && mem >= 0) json_object_set_new(beat, "mem_bytes", json_integer(mem));
        if (send_json(w, CTL_HEARTBEAT, beat, &err))
            _exit(1); /* the daemon is gone */
    }
    return NULL;
}

static void on_ckpt_message(worker *w, const ctl_msg *m) {
    json_t *body;
    errbuf err;
    if (ctl_msg_json(m, &body, &err)) return;
    if (m->type == CTL_CKPT_BEGIN) {
        long long id = (long long)json_integer_value(json_object_get(body, "request"));
        long long seen = atomic_load(&w->ckpt_request);
        while (id > seen && !atomic_compare_exchange_weak(&w->ckpt_request, &seen, id)) {
        }
        /* After the request: the training thread reads the stop first (train.c). */
        if (json_is_true(json_object_get(body, "stop"))) atomic_store(&w->stop_requested, TRAIN_STOP_SAVE);
    } else {
        pthread_mutex_lock(&w->writer_lock);
        if (w->writer_live)
            ckpt_writer_abort(&w->writer, (int64_t)json_integer_value(json_object_get(body, "step")),
                              (int)json_integer_value(json_object_get(body, "attempt")));
        pthread_mutex_unlock(&w->writer_lock);
    }
    json_decref(body);
}

/* Reads the daemon's messages while training runs. */
static void *control_loop(void *arg) {
    worker *w = arg;
    for (;;) {
        ctl_msg m;
        errbuf err;
        if (ctl_recv(w->fd, &m, -1, &err)) _exit(1); /* connection closed: the job is over */
        int none = 0; /* a STOP does not cancel the save of a stop that asked for one */
        if (m.type == CTL_STOP) atomic_compare_exchange_strong(&w->stop_requested, &none, TRAIN_STOP);
        if (m.type == CTL_CKPT_BEGIN || m.type == CTL_CKPT_ABORT) on_ckpt_message(w, &m);
        ctl_msg_free(&m);
    }
    return NULL;
}

static int64_t ckpt_request(void *arg) {
    worker *w = arg;
    return atomic_load(&w->ckpt_request);
}

/* Called by the thread that wrote (or failed to write) a shard file. */
static void report_ckpt(void *arg, const ckpt_report *r) {
    worker *w = arg;
    errbuf err;
    json_t *m = json_pack("{s:I, s:i, s:i, s:b, s:b, s:b, s:s, s:s, s:I, s:I, s:f, s:f}", "step",
                          (json_int_t)r->step, "attempt", r->attempt, "rank", r->rank, "sync", r->sync,
                          "ok", r->ok, "aborted", r->aborted, "error", r->error, "file", r->file, "bytes",
                          (json_int_t)r->bytes, "header_crc32c", (json_int_t)r->header_crc,
                          "stage_s", r->stage_s, "write_s", r->write_s);
    if (m && r->rank == 0 && r->ok) {
        json_object_set_new(m, "optimizer_step", json_integer(r->optimizer_step));
        json_object_set_new(m, "tokens_seen", json_integer(r->tokens_seen));
        json_t *units = ckpt_layout_to_json(r->layout);
        if (!units || json_object_set_new(m, "units", units)) m = (json_decref(m), NULL);
    }
    if (send_json(w, CTL_CKPT_DONE, m, &err)) _exit(1);
}

static void on_step(void *arg, const train_step_info *s) {
    worker *w = arg;
    atomic_store(&w->step, s->step);
    atomic_store(&w->mem_bytes, s->mem_bytes);
    if (w->rank == 0) {
        errbuf err;
        json_t *m = json_pack("{s:I, s:I, s:f, s:f, s:f, s:I, s:I, s:f, s:I, s:I, s:I}", "step",
                              (json_int_t)s->step, "total_steps", (json_int_t)s->total_steps, "loss",
                              s->loss, "lr", s->lr, "grad_norm", s->grad_norm, "tokens",
                              (json_int_t)s->tokens, "tokens_seen", (json_int_t)s->tokens_seen,
                              "seconds", s->seconds, "layer_forwards", (json_int_t)s->layer_forwards,
                              "mem_bytes", (json_int_t)s->mem_bytes, "mem_peak_bytes",
                              (json_int_t)s->mem_peak_bytes);
        static const char *const modes[] = {[TRAIN_CKPT_ASYNC] = "async", [TRAIN_CKPT_SYNC] = "sync",
                                            [TRAIN_CKPT_SKIPPED] = "skipped"};
        if (m && s->ckpt != TRAIN_CKPT_NONE)
            json_object_set_new(m, "checkpoint",
                                json_pack("{s:I, s:i, s:s, s:I}", "step", (json_int_t)s->step, "attempt",
                                          s->ckpt_attempt, "mode", modes[s->ckpt], "request",
                                          (json_int_t)s->ckpt_request));
        if (send_json(w, CTL_METRICS, m, &err)) _exit(1);
    }
    if (!strcmp(w->fault_action, "exit") && s->step == w->fault_step) _exit(3);
}

static int should_stop(void *arg) {
    worker *w = arg;
    int stop = atomic_load(&w->stop_requested);
    if (stop && !strcmp(w->fault_action, "hang_on_stop"))
        for (;;) pause();
    return stop;
}

/* FSDP_TEST_WORKER_FAULT is a comma-separated list of RANK:ACTION[:STEP]; the first entry
 * for this rank applies. */
static void read_fault_hook(worker *w) {
    const char *spec = getenv("FSDP_TEST_WORKER_FAULT");
    while (spec && *spec) {
        int rank, step = 0;
        char action[32];
        if (sscanf(spec, "%d:%31[a-z_]:%d", &rank, action, &step) >= 2 && rank == w->rank) {
            snprintf(w->fault_action, sizeof w->fault_action, "%s", action);
            w->fault_step = step;
            return;
        }
        spec = strchr(spec, ',');
        if (spec) spec++;
    }
}

static int run(worker *w, errbuf *err) {
    if (send_json(w, CTL_HELLO, json_pack("{s:i}", "pid", (int)getpid()), err)) return -1;
    int rc = read_config(w, err);
    w->permanent = rc < 0;
    if (rc) return rc;
    read_fault_hook(w);
    pthread_t hb, ctl;
    if (pthread_create(&hb, NULL, heartbeat_loop, w) != 0) return errf(err, "cannot start the heartbeat thread");
    kctx ctx;
    comm *c = NULL;
    int gpus;
    if (open_context(w, &ctx, &gpus, err)) return -1;
    rc = connect_peers(w, &ctx, gpus, &c, err);
    json_t *start = NULL;
    if (rc == 0) rc = send_json(w, CTL_HEARTBEAT, json_pack("{s:b}", "ready", 1), err);
    if (rc == 0) rc = expect(w, CTL_START, &start, err);
    json_decref(start);
    ckpt_writer_options wopt = {.dir = w->job.checkpoint.dir, .rank = w->rank,
                                .timeout_s = w->job.checkpoint.timeout_s, .report = report_ckpt, .arg = w};
    int have_writer = rc == 0 && ckpt_writer_init(&w->writer, &wopt, err) == 0;
    if (rc == 0 && !have_writer) rc = -1;
    w->writer_live = have_writer;
    if (rc == 0 && pthread_create(&ctl, NULL, control_loop, w) != 0)
        rc = errf(err, "cannot start the control thread");
    if (rc == 0) {
        train_env env = {.job = &w->job, .rank = w->rank, .world = w->world, .comm = c, .ctx = &ctx,
                         .hooks = {.arg = w, .on_step = on_step, .should_stop = should_stop,
                                   .ckpt_request = ckpt_request},
                         .writer = &w->writer, .ckpt_attempt = w->ckpt_attempt,
                         .resume_dir = w->resume_dir[0] ? w->resume_dir : NULL,
                         .model_fd = w->model_fd};
        rc = train_run(&env, err);
        w->permanent = rc == TRAIN_ERR_SETUP;
    }
    /* A save still being written after a stop or a failure is of no use: abandon it. */
    pthread_mutex_lock(&w->writer_lock);
    w->writer_live = 0;
    pthread_mutex_unlock(&w->writer_lock);
    if (have_writer) ckpt_writer_destroy(&w->writer, rc != 0 || atomic_load(&w->stop_requested));
    comm_destroy(c);
    kctx_destroy(&ctx);
    return rc;
}

int main(int argc, char **argv) {
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    static worker w = {.fd = -1, .send_lock = PTHREAD_MUTEX_INITIALIZER,
                       .writer_lock = PTHREAD_MUTEX_INITIALIZER, .mem_bytes = -1};
    if (argc == 3 && !strcmp(argv[1], "--ctl-fd")) w.fd = atoi(argv[2]);
    if (w.fd < 0) {
        fprintf(stderr, "usage: fsdp-worker --ctl-fd FD (fsdpd starts workers; run fsdpd)\n");
        return 2;
    }
    errbuf err;
    int rc = run(&w, &err);
    if (rc == 1) return 0; /* stopped before training began */
    if (!strcmp(w.fault_action, "hang_on_stop"))
        for (;;) pause(); /* the job is over for this worker, but it will not exit */
    if (rc != 0) {
        errbuf ignored;
        fprintf(stderr, "fsdp-worker rank %d: %s\n", w.rank, err.msg);
        json_t *fatal = json_pack("{s:s, s:b}", "message", err.msg, "permanent", w.permanent);
        send_json(&w, CTL_FATAL, fatal, &ignored);
        return 1;
    }
    return 0;
}
