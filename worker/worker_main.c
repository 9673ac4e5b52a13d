/* fsdp-worker: one rank of a job.  fsdpd starts it with its end of a socketpair as a file
 * descriptor (--ctl-fd); everything else — the job, the rank, the peers — comes over that
 * connection (proto/msg.h: every message and its fields).
 *
 * Signals: SLURM signals every process of a step, but the daemon decides, so SIGTERM,
 * SIGINT and SIGUSR1 are ignored here; the worker stops on a STOP message, dies with its
 * daemon (PR_SET_PDEATHSIG, set by fsdpd before exec) and exits when its connection closes.
 *
 * Checkpoints: CKPT_BEGIN asks for a checkpoint at the next step boundary (worker/train.h
 * says how the ranks agree on the step); with stop (SIGTERM) for a synchronous one after the
 * step in progress, and a stop after it.  CKPT_ABORT stops that save's writing; each written
 * (or failed, or aborted) shard file is reported with CKPT_DONE, rank 0's also with the
 * optimizer step, tokens seen and the layout for the manifest.  A METRICS message announces
 * each save before its files are written.
 *
 * A FATAL is permanent when no restart can cure the error: the job (CONFIG) does not
 * validate, or loading the model, the checkpoint or the data failed.
 *
 * Fault points (base/fault.h): worker=RANK:exit:STEP exits with status 3 after that step;
 * worker=RANK:hang_on_stop hangs when asked to stop (or when training ends): fsdpd must kill
 * it. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/fileio.h"
#include "base/path.h"
#include "base/fault.h"
#include "kernels/kernels.h"
#include "proto/job.h"
#include "proto/msg.h"
#include "proto/nccl_log.h"
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
    char bind_host[MSG_ADDR_MAX];
    unsigned char secret[MSG_SECRET_BYTES];
    job_config job;
    llama_config model;
    atomic_int stop_requested; /* 0, TRAIN_STOP or TRAIN_STOP_SAVE */
    atomic_long step;
    atomic_llong work_done;    /* train_hooks.on_progress calls, for the heartbeats */
    atomic_llong mem_bytes;    /* context memory in use after the last step (-1: none yet) */
    pthread_mutex_t timing_lock;
    msg_timing timing;         /* its steps' times so far, for the heartbeats (under timing_lock) */
    atomic_llong ckpt_request; /* the newest checkpoint request received */
    atomic_llong ckpt_sync_request; /* the newest that asked for a synchronous save */
    comm_progress progress;    /* its collectives, for the heartbeats (the locator) */
    atomic_int have_comm;      /* progress is tracked: a communicator exists */
    int ckpt_attempt;
    char resume_dir[JOB_PATH_MAX];
    int memory_fd, memory_slots;   /* the node's in-memory images (msg_config) */
    bool memory_resume;
    ckpt_writer writer;
    pthread_mutex_t writer_lock; /* the control thread uses the writer only while writer_live */
    int writer_live;
    const fault *fault; /* this rank's worker fault, or NULL */
    int permanent; /* the error is one no restart can cure */
    msg_sample_prompts samples; /* train.sample_prompts, tokenized by fsdpd (n 0: none) */
} worker;

static int send(worker *w, const msg *m, errbuf *err) {
    pthread_mutex_lock(&w->send_lock);
    int rc = msg_send(w->fd, m, err);
    pthread_mutex_unlock(&w->send_lock);
    return rc;
}

/* Receives a message of the expected type; a STOP instead means the job ended first (1). */
static int expect(worker *w, msg_type type, msg *m, errbuf *err) {
    if (msg_recv(w->fd, m, SETUP_TIMEOUT_MS, err)) return errprefix(err, "waiting for %s", msg_type_name(type));
    if (m->type == type) return 0;
    int stopped = m->type == MSG_STOP;
    errf(err, "expected %s, got %s", msg_type_name(type), msg_type_name(m->type));
    msg_free(m);
    return stopped ? 1 : -1;
}

/* CONFIG: the decoder has checked every field, the job (valid for the world) and the
 * model config. */
static int read_config(worker *w, errbuf *err) {
    msg m;
    int rc = expect(w, MSG_CONFIG, &m, err);
    if (rc) return rc;
    const msg_config *c = &m.u.config;
    w->rank = c->rank;
    w->local_rank = c->local_rank;
    w->world = c->world;
    w->model_fd = c->model_fd;
    w->ckpt_attempt = c->ckpt_attempt;
    w->job = c->job;
    w->model = c->model;
    strcpy(w->bind_host, c->bind_host);
    strcpy(w->resume_dir, c->resume_dir);
    w->memory_fd = c->memory_fd;
    w->memory_slots = c->memory_slots;
    w->memory_resume = c->memory_resume;
    rc = hex_decode(c->secret, w->secret, MSG_SECRET_BYTES) ? errf(err, "CONFIG: a malformed secret") : 0;
    if (rc == 0 && c->samples && msg_sample_prompts_read(c->samples, c->model.vocab_size, &w->samples, err))
        rc = errprefix(err, "CONFIG: samples");
    msg_free(&m);
    return rc;
}

/* TCP rings: publish our address, learn theirs, connect. */
static int connect_tcp(worker *w, comm **out, errbuf *err) {
    comm_listener l;
    if (comm_tcp_listen(&l, w->bind_host, err)) return -1;
    msg addr = {.type = MSG_ADDR}, peers = {0};
    snprintf(addr.u.addr.addr, sizeof addr.u.addr.addr, "%s", l.addr);
    int rc = send(w, &addr, err);
    if (rc == 0) rc = expect(w, MSG_PEERS, &peers, err);
    if (rc == 0 && peers.u.peers.n != w->world)
        rc = errf(err, "PEERS: %d addresses for a world of %d", peers.u.peers.n, w->world);
    const char **table = rc == 0 ? calloc((size_t)w->world, sizeof *table) : NULL;
    if (rc == 0 && !table) rc = errf(err, "out of memory");
    for (int r = 0; rc == 0 && r < w->world; r++) table[r] = peers.u.peers.addrs[r];
    if (rc == 0) {
        comm_options opt = {.timeout_s = w->job.runtime.comm_timeout_s, .init_timeout_s = 60,
                            .progress = &w->progress};
        memcpy(opt.secret, w->secret, sizeof opt.secret);
        comm_rank_table t = {.world = w->world, .addr = table};
        rc = comm_init(out, &opt, w->rank, &t, &l, err);
    }
    comm_listener_close(&l);
    free(table);
    msg_free(&peers);
    return rc;
}

#ifdef FSDP_HAVE_CUDA
/* NCCL: global rank 0 makes the unique id, fsdpd relays it to every rank. */
static int connect_nccl(worker *w, kctx *ctx, comm **out, errbuf *err) {
    msg id = {.type = MSG_NCCL_ID};
    if (w->rank == 0 && (comm_nccl_make_id(id.u.nccl_id.id, err) || send(w, &id, err))) return -1;
    if (expect(w, MSG_NCCL_ID, &id, err)) return -1;
    comm_options opt = {.timeout_s = w->job.runtime.comm_timeout_s, .init_timeout_s = 120,
                        .progress = &w->progress};
    return comm_nccl_init(out, &opt, w->rank, w->world, id.u.nccl_id.id, ctx, err);
}
#endif

/* hybrid_shard over several nodes: the shard group (this node's ranks) and the replica group
 * (this local rank on every node), split from the world's communicator. */
static int hybrid_nodes(const worker *w) {
    int per_node = w->job.runtime.workers_per_node;
    return w->job.fsdp.sharding == JOB_SHARD_HYBRID && per_node > 0 ? w->world / per_node : 1;
}

static comm_options group_options(const worker *w) {
    comm_options opt = {.timeout_s = w->job.runtime.comm_timeout_s, .init_timeout_s = 60};
    memcpy(opt.secret, w->secret, sizeof opt.secret); /* not tracked: the locator follows the world's */
    return opt;
}

static int split_tcp(worker *w, comm *world, comm **shard, comm **replica, errbuf *err) {
    comm_options opt = group_options(w);
    int per_node = w->job.runtime.workers_per_node;
    if (comm_tcp_split(world, &opt, w->bind_host, w->rank / per_node, shard, err)) return -1;
    return comm_tcp_split(world, &opt, w->bind_host, w->rank % per_node, replica, err);
}

#ifdef FSDP_HAVE_CUDA
static int split_nccl(worker *w, kctx *ctx, comm *world, comm **shard, comm **replica, errbuf *err) {
    comm_options opt = group_options(w);
    int per_node = w->job.runtime.workers_per_node, nodes = w->world / per_node;
    int node = w->rank / per_node, local = w->rank % per_node;
    if (comm_nccl_split(world, &opt, node, local, per_node, ctx, shard, err)) return -1;
    return comm_nccl_split(world, &opt, local, node, nodes, ctx, replica, err);
}
#endif

/* NCCL when every rank of this node has a GPU of its own (NCCL refuses two on one). */
static int uses_nccl(const worker *w, const kctx *ctx, int gpus) {
#ifdef FSDP_HAVE_CUDA
    return ctx->backend == K_CUDA && w->job.runtime.workers_per_node <= gpus;
#else
    (void)w, (void)ctx, (void)gpus;
    return 0;
#endif
}

/* The communicators of a rank: the world's, and with hybrid_shard over several nodes the
 * shard and replica groups' (NULL otherwise). */
typedef struct peers {
    comm *world, *shard, *replica;
} peers;

static void peers_close(peers *p) {
    comm_destroy(p->replica); /* split from world: before it (NCCL shares its stream) */
    comm_destroy(p->shard);
    comm_destroy(p->world);
    *p = (peers){0};
}

/* Each of p's communicators through host memory. */
static int stage_peers(peers *p, kctx *ctx, errbuf *err) {
    comm **all[] = {&p->world, &p->shard, &p->replica};
    for (int i = 0; i < 3; i++)
        if (*all[i] && comm_stage_through_host(all[i], ctx, err)) return -1;
    return 0;
}

/* Joins the peers: NCCL when every rank has a GPU of its own, else TCP rings (through host
 * memory when the buffers are on a GPU); hybrid_shard's groups split from the world's. */
static int connect_peers(worker *w, kctx *ctx, int gpus, peers *out, errbuf *err) {
    *out = (peers){0};
    if (w->world == 1) return 0;
    int rc, split = hybrid_nodes(w) > 1;
#ifdef FSDP_HAVE_CUDA
    if (uses_nccl(w, ctx, gpus)) {
        rc = connect_nccl(w, ctx, &out->world, err);
        if (rc == 0 && split) rc = split_nccl(w, ctx, out->world, &out->shard, &out->replica, err);
        if (rc) peers_close(out);
        return rc;
    }
#else
    (void)gpus;
#endif
    rc = connect_tcp(w, &out->world, err);
    if (rc == 0 && split) rc = split_tcp(w, out->world, &out->shard, &out->replica, err);
    if (rc == 0 && ctx->backend == K_CUDA) rc = stage_peers(out, ctx, err);
    if (rc) peers_close(out);
    return rc;
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

/* The transport NCCL chose, from this process's NCCL_DEBUG_FILE (fsdpd points it at one
 * file a worker, nccl-%h-%p.log); "" when there is no such file or it does not say. */
static void nccl_transport(char *out, size_t n) {
    const char *pattern = getenv("NCCL_DEBUG_FILE");
    char path[PATH_BYTES], host[256] = "";
    size_t at = 0;
    out[0] = '\0';
    if (!pattern || gethostname(host, sizeof host) != 0) return;
    for (const char *p = pattern; *p && at + 1 < sizeof path; p++) {
        int k = 0;
        if (p[0] == '%' && p[1] == 'h') k = snprintf(path + at, sizeof path - at, "%s", host);
        else if (p[0] == '%' && p[1] == 'p') k = snprintf(path + at, sizeof path - at, "%d", (int)getpid());
        else path[at++] = *p;
        if (k) p++, at += (size_t)k;
        if (at >= sizeof path) return;
    }
    path[at] = '\0';
    char *text;
    size_t len;
    errbuf ignored;
    if (file_read_all(path, 16u << 20, &text, &len, &ignored)) return;
    nccl_log_transport(text, len, out, n);
    free(text);
}

/* Whether the network check runs: fabric.preflight, auto = on for more than one node. */
static int preflight_on(const worker *w) {
    const job_config *j = &w->job;
    if (j->fabric.preflight == JOB_PREFLIGHT_AUTO) return w->world > j->runtime.workers_per_node;
    return j->fabric.preflight == JOB_PREFLIGHT_ON;
}

/* The network check: all_reduce of PREFLIGHT_BYTES over every rank, timed; bus bandwidth as
 * nccl-tests counts it (algorithm bandwidth x 2 (world - 1) / world). */
#define PREFLIGHT_ITERS 5
static int preflight(worker *w, kctx *ctx, comm *c, msg_net *net, errbuf *err) {
    size_t bytes = ctx->backend == K_CUDA ? 64u << 20 : 4u << 20, count = bytes / sizeof(float);
    float *buf = k_alloc(ctx, bytes, err);
    if (!buf) return errprefix(err, "the network check (fabric.preflight)");
    int rc = comm_all_reduce(c, buf, count, COMM_F32, COMM_SUM, err) || k_sync(ctx, err); /* warm up */
    double t0 = clock_now_s();
    for (int i = 0; rc == 0 && i < PREFLIGHT_ITERS; i++) rc = comm_all_reduce(c, buf, count, COMM_F32, COMM_SUM, err);
    if (rc == 0) rc = k_sync(ctx, err);
    double t = (clock_now_s() - t0) / PREFLIGHT_ITERS;
    k_free(ctx, buf);
    if (rc) return errprefix(err, "the network check (fabric.preflight)");
    net->measured = true;
    net->busbw_gbps = (double)bytes / (t > 1e-9 ? t : 1e-9) * 2.0 * (w->world - 1) / w->world / 1e9;
    return 0;
}

/* The ready heartbeat's network: the transport, and the check's figure. */
static int describe_net(worker *w, kctx *ctx, comm *c, int nccl, msg_net *net, errbuf *err) {
    memset(net, 0, sizeof *net);
    if (nccl) nccl_transport(net->transport, sizeof net->transport);
    else snprintf(net->transport, sizeof net->transport, "tcp");
    return c && preflight_on(w) ? preflight(w, ctx, c, net, err) : 0;
}

static void *heartbeat_loop(void *arg) {
    worker *w = arg;
    for (;;) {
        sleep((unsigned)w->job.runtime.heartbeat_s);
        errbuf err;
        long long mem = atomic_load(&w->mem_bytes);
        msg beat = {.type = MSG_HEARTBEAT,
                    .u.heartbeat = {.has_step = true, .step = atomic_load(&w->step),
                                    .has_progress = true, .progress = atomic_load(&w->work_done),
                                    .has_mem_bytes = mem >= 0, .mem_bytes = mem,
                                    .has_coll = atomic_load(&w->have_comm) != 0}};
        pthread_mutex_lock(&w->timing_lock);
        beat.u.heartbeat.timing = w->timing;
        pthread_mutex_unlock(&w->timing_lock);
        beat.u.heartbeat.has_timing = beat.u.heartbeat.timing.steps > 0;
        if (beat.u.heartbeat.has_coll) {
            msg_coll *c = &beat.u.heartbeat.coll;
            c->started = (int64_t)atomic_load(&w->progress.started);
            c->finished = (int64_t)atomic_load(&w->progress.finished);
            c->unit = atomic_load(&w->progress.unit);
            snprintf(c->op, sizeof c->op, "%s", comm_coll_name(atomic_load(&w->progress.op)));
        }
        if (send(w, &beat, &err)) _exit(1); /* the daemon is gone */
    }
    return NULL;
}

static void on_ckpt_begin(worker *w, const msg_ckpt_begin *b) {
    if (b->sync) atomic_store(&w->ckpt_sync_request, b->request); /* before the request: read after it */
    long long seen = atomic_load(&w->ckpt_request);
    while (b->request > seen && !atomic_compare_exchange_weak(&w->ckpt_request, &seen, b->request)) {
    }
    /* After the request: the training thread reads the stop first (train.c). */
    if (b->stop) atomic_store(&w->stop_requested, TRAIN_STOP_SAVE);
}

static void on_ckpt_abort(worker *w, const msg_ckpt_abort *a) {
    pthread_mutex_lock(&w->writer_lock);
    if (w->writer_live) ckpt_writer_abort(&w->writer, a->step, a->attempt);
    pthread_mutex_unlock(&w->writer_lock);
}

/* Reads the daemon's messages while training runs. */
static void *control_loop(void *arg) {
    worker *w = arg;
    for (;;) {
        msg m;
        errbuf err;
        if (msg_recv(w->fd, &m, -1, &err)) _exit(1); /* connection closed (or broken): the job is over */
        int none = 0; /* a STOP does not cancel the save of a stop that asked for one */
        if (m.type == MSG_STOP) atomic_compare_exchange_strong(&w->stop_requested, &none, TRAIN_STOP);
        if (m.type == MSG_CKPT_BEGIN) on_ckpt_begin(w, &m.u.ckpt_begin);
        if (m.type == MSG_CKPT_ABORT) on_ckpt_abort(w, &m.u.ckpt_abort);
        msg_free(&m);
    }
    return NULL;
}

static int64_t ckpt_request(void *arg) {
    worker *w = arg;
    return atomic_load(&w->ckpt_request);
}

static int64_t ckpt_sync_request(void *arg) {
    worker *w = arg;
    return atomic_load(&w->ckpt_sync_request);
}

/* Called by the thread that wrote (or failed to write) a shard file. */
static void report_ckpt(void *arg, const ckpt_report *r) {
    worker *w = arg;
    errbuf err;
    msg m = {.type = MSG_CKPT_DONE};
    msg_ckpt_done *d = &m.u.ckpt_done;
    *d = (msg_ckpt_done){.step = r->step, .attempt = r->attempt, .rank = r->rank, .sync = r->sync,
                         .memory = r->memory, .ok = r->ok, .aborted = r->aborted, .bytes = (int64_t)r->bytes,
                         .header_crc32c = r->header_crc, .stage_s = r->stage_s, .write_s = r->write_s};
    snprintf(d->error, sizeof d->error, "%s", r->error);
    snprintf(d->file, sizeof d->file, "%s", r->file);
    if (r->rank == 0 && r->ok) {
        d->has_optimizer_step = d->has_tokens_seen = true;
        d->optimizer_step = r->optimizer_step;
        d->tokens_seen = r->tokens_seen;
        if (!(d->units = ckpt_layout_to_json(r->layout))) _exit(1);
    }
    if (send(w, &m, &err)) _exit(1);
    msg_free(&m);
}

/* A preference objective's figures, under TRL's names (ORPO's three of its own). */
static void set_pref_metrics(msg_metrics *m, const train_step_info *s) {
    const double *p = s->pref;
    m->has_rewards_chosen = m->has_rewards_rejected = m->has_rewards_accuracies = m->has_rewards_margins = true;
    m->has_logps_chosen = m->has_logps_rejected = true;
    m->rewards_chosen = p[PREF_REWARD_CHOSEN], m->rewards_rejected = p[PREF_REWARD_REJECTED];
    m->rewards_accuracies = p[PREF_ACCURACY];
    m->rewards_margins = p[PREF_REWARD_CHOSEN] - p[PREF_REWARD_REJECTED];
    m->logps_chosen = p[PREF_LOGPS_CHOSEN], m->logps_rejected = p[PREF_LOGPS_REJECTED];
    if (s->objective != JOB_OBJECTIVE_ORPO) return;
    m->has_nll_loss = m->has_log_odds_ratio = m->has_log_odds_chosen = true;
    m->nll_loss = p[PREF_NLL], m->log_odds_ratio = p[PREF_LOG_ODDS_RATIO], m->log_odds_chosen = p[PREF_LOG_ODDS_CHOSEN];
}

static void on_step(void *arg, const train_step_info *s) {
    worker *w = arg;
    atomic_store(&w->step, s->step);
    atomic_store(&w->mem_bytes, s->mem_bytes);
    pthread_mutex_lock(&w->timing_lock);
    w->timing.steps++;
    w->timing.step_s += s->iter_s;
    w->timing.comm_s += s->comm_s;
    w->timing.data_s += s->data_s;
    pthread_mutex_unlock(&w->timing_lock);
    if (w->rank == 0) {
        errbuf err;
        msg m = {.type = MSG_METRICS,
                 .u.metrics = {.step = s->step, .total_steps = s->total_steps, .loss = s->loss, .lr = s->lr,
                               .grad_norm = s->grad_norm, .tokens = s->tokens, .tokens_seen = s->tokens_seen,
                               .seconds = s->seconds, .layer_forwards = s->layer_forwards,
                               .all_gathers = s->all_gathers, .replica_collectives = s->replica_collectives,
                               .gathered_bytes = s->gathered_bytes,
                               .mem_bytes = s->mem_bytes, .mem_peak_bytes = s->mem_peak_bytes,
                               .has_eval_loss = s->has_eval != 0, .eval_loss = s->eval_loss}};
        static const char *const modes[] = {[TRAIN_CKPT_ASYNC] = "async", [TRAIN_CKPT_SYNC] = "sync",
                                            [TRAIN_CKPT_SKIPPED] = "skipped"};
        msg_metrics *mm = &m.u.metrics;
        if (s->ckpt != TRAIN_CKPT_NONE && s->ckpt != TRAIN_CKPT_MEMORY) { /* memory saves are not announced */
            mm->has_checkpoint = true;
            mm->checkpoint = (msg_ckpt_note){.step = s->step, .attempt = s->ckpt_attempt, .request = s->ckpt_request};
            snprintf(mm->checkpoint.mode, sizeof mm->checkpoint.mode, "%s", modes[s->ckpt]);
        }
        if (s->objective != JOB_OBJECTIVE_SFT) set_pref_metrics(mm, s);
        if (send(w, &m, &err)) _exit(1);
    }
    if (w->fault && !strcmp(w->fault->action, "exit") && s->step == w->fault->n) _exit(3);
    if (w->fault && !strcmp(w->fault->action, "hang") && s->step == w->fault->n) fault_hang();
}

static void on_progress(void *arg) {
    worker *w = arg;
    atomic_fetch_add(&w->work_done, 1);
}

/* Rank 0's replies to the sample prompts, to fsdpd (which writes samples.jsonl). */
static int on_sample(void *arg, long step, int prompt, const int32_t *ids, int n, const char *stop) {
    worker *w = arg;
    errbuf err;
    msg m = {.type = MSG_SAMPLE, .u.sample = {.step = step, .prompt_index = prompt,
                                              .reply_ids = msg_ids_json(ids, n)}};
    snprintf(m.u.sample.stop, sizeof m.u.sample.stop, "%s", stop);
    int rc = m.u.sample.reply_ids ? send(w, &m, &err) : -1;
    msg_free(&m);
    if (rc) _exit(1); /* as on_step: the daemon is gone */
    return 0;
}

static int should_stop(void *arg) {
    worker *w = arg;
    int stop = atomic_load(&w->stop_requested);
    if (stop && w->fault && !strcmp(w->fault->action, "hang_on_stop")) fault_hang();
    return stop;
}

static int run(worker *w, errbuf *err) {
    msg hello = {.type = MSG_HELLO, .u.hello = {.pid = (int)getpid()}};
    if (send(w, &hello, err)) return -1;
    int rc = read_config(w, err);
    w->permanent = rc < 0;
    if (rc) return rc;
    w->fault = fault_get(FAULT_WORKER, w->rank);
    pthread_t hb, ctl;
    if (pthread_create(&hb, NULL, heartbeat_loop, w) != 0) return errf(err, "cannot start the heartbeat thread");
    kctx ctx;
    peers p = {0};
    int gpus;
    if (open_context(w, &ctx, &gpus, err)) return -1;
    k_set_memory_limit(&ctx, (size_t)w->job.runtime.gpu_memory_limit); /* nothing allocates past it */
    atomic_store(&w->progress.unit, -1);
    rc = connect_peers(w, &ctx, gpus, &p, err);
    comm *c = p.world;
    if (rc == 0 && c) atomic_store(&w->have_comm, 1);
    msg ready = {.type = MSG_HEARTBEAT, .u.heartbeat = {.ready = true, .has_net = c != NULL}}, start;
    if (rc == 0 && c) rc = describe_net(w, &ctx, c, uses_nccl(w, &ctx, gpus), &ready.u.heartbeat.net, err);
    if (rc == 0) rc = send(w, &ready, err);
    if (rc == 0 && (rc = expect(w, MSG_START, &start, err)) == 0) msg_free(&start);
    ckpt_writer_options wopt = {.dir = w->job.checkpoint.dir,
                                .memory_fd = w->memory_fd >= 0 ? w->memory_fd + 2 * w->local_rank : -1,
                                .memory_slots = w->memory_slots, .rank = w->rank,
                                .timeout_s = w->job.checkpoint.timeout_s, .report = report_ckpt, .arg = w};
    int have_writer = rc == 0 && ckpt_writer_init(&w->writer, &wopt, err) == 0;
    if (rc == 0 && !have_writer) rc = -1;
    w->writer_live = have_writer;
    if (rc == 0 && pthread_create(&ctl, NULL, control_loop, w) != 0)
        rc = errf(err, "cannot start the control thread");
    if (rc == 0) {
        train_env env = {.job = &w->job, .model = &w->model, .rank = w->rank, .world = w->world, .comm = c,
                         .shard_comm = p.shard, .replica_comm = p.replica, .ctx = &ctx,
                         .hooks = {.arg = w, .on_step = on_step, .on_progress = on_progress, .should_stop = should_stop,
                                   .ckpt_request = ckpt_request, .ckpt_sync_request = ckpt_sync_request,
                                   .on_sample = on_sample},
                         .samples = w->samples.n ? &w->samples : NULL,
                         .writer = &w->writer, .ckpt_attempt = w->ckpt_attempt,
                         .resume_dir = w->resume_dir[0] ? w->resume_dir : NULL,
                         .memory = {.fd = w->memory_resume ? w->memory_fd : -1,
                                    .workers = w->job.runtime.workers_per_node,
                                    .node = w->rank / w->job.runtime.workers_per_node},
                         .model_fd = w->model_fd};
        rc = train_run(&env, err);
        w->permanent = rc == TRAIN_ERR_SETUP;
    }
    /* A save still being written after a stop or a failure is of no use: abandon it. */
    pthread_mutex_lock(&w->writer_lock);
    w->writer_live = 0;
    pthread_mutex_unlock(&w->writer_lock);
    if (have_writer) ckpt_writer_destroy(&w->writer, rc != 0 || atomic_load(&w->stop_requested));
    peers_close(&p);
    kctx_destroy(&ctx);
    msg_sample_prompts_free(&w->samples);
    return rc;
}

int main(int argc, char **argv) {
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    static worker w = {.fd = -1, .send_lock = PTHREAD_MUTEX_INITIALIZER,
                       .writer_lock = PTHREAD_MUTEX_INITIALIZER, .timing_lock = PTHREAD_MUTEX_INITIALIZER,
                       .mem_bytes = -1};
    if (argc == 3 && !strcmp(argv[1], "--ctl-fd")) w.fd = atoi(argv[2]);
    if (w.fd < 0) {
        fprintf(stderr, "usage: fsdp-worker --ctl-fd FD (fsdpd starts workers; run fsdpd)\n");
        return 2;
    }
    errbuf err;
    int rc = fault_init(&err);
    w.permanent = rc != 0;
    if (rc == 0) rc = run(&w, &err);
    if (rc == 1) return 0; /* stopped before training began */
    if (w.fault && !strcmp(w.fault->action, "hang_on_stop"))
        fault_hang(); /* the job is over for this worker, but it will not exit */
    if (rc != 0) {
        errbuf ignored;
        fprintf(stderr, "fsdp-worker rank %d: %s\n", w.rank, err.msg);
        msg fatal = {.type = MSG_FATAL, .u.fatal = {.permanent = w.permanent}};
        snprintf(fatal.u.fatal.message, sizeof fatal.u.fatal.message, "%s", err.msg);
        send(&w, &fatal, &ignored);
        return 1;
    }
    return 0;
}
