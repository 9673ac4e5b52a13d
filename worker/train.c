/* train: one worker's training loop: data, steps, schedule, checkpoint triggers; see train.h. */
#include "worker/train.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fault.h"
#include "base/path.h"
#include "data/rows.h"
#include "model/memory_plan.h"
#include "model/step_plan.h"
#include "proto/ckpt.h"
#include "proto/model_config.h"
#include "proto/model_image.h"
#include "proto/peft.h"
#include "proto/safetensors.h"
#include "worker/ckpt_writer.h"
#include "worker/fsdp.h"
#include "worker/fsdp_generate.h"
#include "worker/schedule.h"

/* Votes every rank casts before a step (fsdp.vote). */
enum { VOTE_REQUEST, VOTE_WRITING, VOTE_STOP, VOTE_SYNC, VOTE_MEMORY, VOTE_BUSY };

/* In-memory saves stall training at most this share of the time (train.h). */
#define MEMORY_SAVE_BUDGET 0.01

/* The pace of this rank's saves into memory: the step and end of the last save of any kind,
 * and what its staging cost. */
typedef struct memory_pace {
    long step;
    double at, stall_s;
} memory_pace;

static int memory_on(const train_env *env) {
    return env->writer && env->writer->slots && env->job->checkpoint.memory_interval_steps > 0;
}

/* This rank's vote for a memory save after step `done`. */
static int memory_vote(const train_env *env, const memory_pace *p, long done) {
    if (!memory_on(env) || done - p->step < env->job->checkpoint.memory_interval_steps) return 0;
    return clock_now_s() - p->at >= p->stall_s / MEMORY_SAVE_BUDGET;
}

/* fsdpd's model memory, mapped. */
typedef struct model_memory {
    const void *data;
    size_t bytes;
} model_memory;

static void unmap_model(model_memory *m) {
    if (m->data) munmap((void *)m->data, m->bytes);
    m->data = NULL;
}

/* The reader takes each shard file of this node's ranks from the image of it that holds the
 * manifest's step (rank f writes file f: its place f - node * workers). */
static int adopt_images(void *arg, ckpt_reader *r, errbuf *err) {
    const train_env *env = arg;
    int workers = env->memory.workers, node = env->memory.node;
    for (int k = 0; k < workers && node * workers + k < r->m->layout.n_files; k++) {
        const int *images = (const int[2]){env->memory.fd + 2 * k, env->memory.fd + 2 * k + 1};
        int file = node * workers + k, s = ckpt_find_image(images, r->m, file, err);
        int fd = s < 0 ? -1 : fcntl(images[s], F_DUPFD_CLOEXEC, 0);
        if (s >= 0 && fd < 0) errf(err, "the image of %s: dup: %s", r->m->files[file].name, strerror(errno));
        if (fd < 0 || ckpt_reader_adopt(r, file, fd, r->m->files[file].name, err)) {
            if (fd >= 0) close(fd);
            return -1;
        }
    }
    return 0;
}

/* This rank's state from a committed checkpoint: parameters, AdamW state, step, tokens. */
static int resume(fsdp *f, const train_env *env, const llama_config *cfg, int64_t *tokens_seen,
                  errbuf *err) {
    const job_config *j = env->job;
    ckpt_manifest m;
    char name[PATH_BYTES];
    int memory = env->memory.fd >= 0;
    snprintf(name, sizeof name, "%s/%s", env->resume_dir, memory ? CKPT_MEMORY_MANIFEST : CKPT_MANIFEST);
    if (ckpt_manifest_load_file(&m, name, err)) return -1;
    int rc = ckpt_manifest_check_model(&m, cfg, name, err);
    if (rc == 0 && (m.global_batch != j->train.global_batch || m.seed != j->train.seed))
        rc = errf(err, "%s: global_batch %d and seed %lld, but the job has %d and %lld", name,
                  m.global_batch, (long long)m.seed, j->train.global_batch, (long long)j->train.seed);
    if (rc == 0) rc = fsdp_load_checkpoint(f, &m, env->resume_dir, memory ? adopt_images : NULL, (void *)env, err);
    if (rc == 0 && f->step != m.step)
        rc = errf(err, "%s: optimizer step %lld differs from step %lld", name,
                  (long long)m.optimizer_step, (long long)m.step);
    *tokens_seen = m.tokens_seen;
    ckpt_manifest_free(&m);
    return rc;
}

/* lora.init_from: the adapters of a PEFT directory, which must be the job's (rank, alpha,
 * rslora, targets; its dropout is a training setting, the job's is used). */
static int adapters_from(fsdp *f, const job_config *j, const llama_config *cfg, errbuf *err) {
    lora_layout lo;
    float **units;
    const char *dir = j->lora.init_from;
    if (peft_load(dir, cfg, &lo, &units, err)) return errprefix(err, "lora.init_from");
    const lora_config *got = &lo.cfg, *want = &f->lora_layout.cfg;
    int rc = 0;
    if (!lora_config_same_adapters(got, want))
        rc = errf(err, "lora.init_from: %s holds adapters of rank %d, alpha %g, rslora %d and "
                       "other targets than the job's lora settings (rank %d, alpha %g, rslora %d)",
                  dir, got->rank, got->alpha, got->rslora, want->rank, want->alpha, want->rslora);
    if (rc == 0) rc = fsdp_set_adapters(f, units, err);
    peft_units_free(units, lo.n_units);
    lora_layout_free(&lo);
    return rc;
}

/* The host optimizer's threads (fsdp.cpu_offload): this node's cores shared by its workers. */
static int offload_threads(const job_config *j) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int workers = j->runtime.workers_per_node > 0 ? j->runtime.workers_per_node : 1;
    return cores > workers ? (int)(cores / workers) : 1;
}

/* What fsdp.activation_checkpointing auto may plan for (step_plan_auto_budget): the limit,
 * else the device's memory (one worker a GPU), else (the CPU backend) no bound. */
static size_t recompute_budget(const train_env *env) {
    size_t device = env->ctx->backend == K_CUDA ? k_cuda_device_memory(env->ctx->device) : 0;
    return step_plan_auto_budget(env->job, device, PLAN_CONTEXT_BYTES);
}

/* This rank's memory plan (model/memory_plan.h), resolved once: the activation
 * checkpointing fsdp runs with (auto: decided here, and logged), the layer inputs
 * fsdp.offload_activations moves to the host (logged) and, under
 * runtime.gpu_memory_limit (which is then auto's budget too), the same plan checked against
 * the limit before fsdp allocates anything: a job that needs more stops here, saying what
 * would fit. */
static int plan_memory(const train_env *env, model_image_quant quant, fsdp_options *opt, errbuf *err) {
    const job_config *j = env->job;
    memory_plan_options o;
    memory_plan_job_options(j, env->model, env->world, env->rank, quant, k_compute_size(env->ctx),
                            recompute_budget(env), &o);
    if (j->fsdp.activation_checkpointing == JOB_ACT_CKPT_AUTO && env->rank == 0) {
        char text[160];
        llama_recompute_format(o.recompute, env->model->num_hidden_layers, text, sizeof text);
        fprintf(stderr, "fsdp-worker rank 0: fsdp.activation_checkpointing auto: %s\n", text);
    }
    if (j->fsdp.offload_activations && env->rank == 0)
        fprintf(stderr, "fsdp-worker rank 0: fsdp.offload_activations: %d of %d layer inputs in host memory\n",
                o.offload_layers, env->model->num_hidden_layers);
    if (j->train.precision == JOB_PRECISION_FP8 && env->rank == 0)
        fprintf(stderr, "fsdp-worker rank 0: train.precision fp8: the projections of layers 1-%d of %d in FP8 "
                        "(e4m3, gradients %s, %s scales; the first and the last layer, attention, norms and the head in the "
                        "compute dtype; %s)\n", env->model->num_hidden_layers - 2, env->model->num_hidden_layers,
                j->train.fp8_grad_format == JOB_FP8_E5M2 ? "e5m2" : "e4m3", j->train.fp8_scaling == JOB_FP8_ROWWISE ? "rowwise" : "tensorwise",
                j->train.fp8_all_gather ? "their weights gathered as e4m3 codes, cast once a gather"
                                        : "their weights gathered in the compute dtype, cast at each GEMM");
    memory_plan planned;
    errbuf unplanned; /* not written: compute_copies is set only where this plan fitted */
    if (o.compute_copies && env->rank == 0 && memory_plan_compute(&o, &planned, &unplanned) == 0)
        fprintf(stderr, "fsdp-worker rank 0: compute copies: the trained weights kept in the compute dtype beside "
                        "their masters (%zu bytes a rank), written by AdamW: no cast at each use\n",
                planned.trainable_elems * k_compute_size(env->ctx));
    opt->recompute = o.recompute;
    opt->offload_layers = o.offload_layers;
    opt->compute_copies = o.compute_copies;
    int64_t limit = j->runtime.gpu_memory_limit;
    return limit > 0 ? memory_plan_check_options(j, &o, (size_t)limit, "runtime.gpu_memory_limit", err) : 0;
}

/* This rank's initial state: from the checkpoint when resuming, else the initial
 * parameters.  *image_out: the model memory, left mapped when fsdp reads it while training
 * (offload_params; the caller unmaps it after fsdp_destroy), else NULL. */
static int load_model(fsdp *f, const train_env *env, model_memory *image_out, int64_t *tokens_seen,
                      errbuf *err) {
    const job_config *j = env->job;
    const llama_config *cfg = env->model;
    memset(f, 0, sizeof *f); /* fsdp_destroy works on it whatever fails */
    *tokens_seen = 0;
    int adapters = j->train.type != JOB_TRAIN_FULL;
    fsdp_options opt = {.sharding = j->fsdp.sharding,
                        .forward_prefetch = j->fsdp.forward_prefetch,
                        .backward_prefetch = j->fsdp.backward_prefetch,
                        .lora = adapters ? &j->lora.config : NULL, .seed = (uint64_t)j->train.seed,
                        .cpu_offload = j->fsdp.cpu_offload, .offload_params = j->fsdp.offload_params,
                        .mlp_chunk = j->fsdp.mlp_chunk,
                        .fp8 = j->train.precision == JOB_PRECISION_FP8,
                        .fp8_scaling = j->train.fp8_scaling == JOB_FP8_ROWWISE ? K_FP8_ROWWISE : K_FP8_TENSORWISE,
                        .fp8_grad_format = j->train.fp8_grad_format == JOB_FP8_E5M2 ? FP8_E5M2 : FP8_E4M3,
                        .fp8_all_gather = j->train.precision == JOB_PRECISION_FP8 && j->train.fp8_all_gather,
                        .offload_threads = offload_threads(j),
                        .shard_comm = env->shard_comm, .replica_comm = env->replica_comm,
                        .pref = {.objective = j->train.objective, .loss = j->train.dpo_loss,
                                 .beta = j->train.objective == JOB_OBJECTIVE_ORPO ? j->train.orpo_lambda
                                                                                : j->train.dpo_beta,
                                 .label_smoothing = j->train.dpo_label_smoothing}};
    /* A full fine-tune's checkpoint holds the whole model; an adapter job's only the
     * adapters, its frozen base always comes from the model memory (whose header says how
     * the base is quantized).  So does a full DPO's reference, the start weights, on a
     * resume as at the start: the model memory is the start weights again (the resume
     * checks model.path's fingerprint against the checkpoint's: daemon/ckpt_commit.c), and
     * keeping them in every checkpoint too would add a second model to each, for nothing. */
    int reference = !adapters && j->train.objective == JOB_OBJECTIVE_DPO;
    if (env->resume_dir && !adapters && !reference) {
        if (plan_memory(env, MODEL_IMAGE_PLAIN, &opt, err) ||
            fsdp_init(f, cfg, env->ctx, env->comm, env->rank, env->world, &opt, err))
            return -1;
        return resume(f, env, cfg, tokens_seen, err);
    }
    if (env->model_fd < 0) return errf(err, "no model memory from fsdpd to start from");
    llama_layout lo;
    const void *image;
    size_t bytes;
    if (llama_layout_init(&lo, cfg, err)) return -1;
    int rc = model_image_map(env->model_fd, &lo, &image, &bytes, err);
    llama_layout_free(&lo);
    if (rc) return errprefix(err, "the model memory from fsdpd");
    opt.quant = model_image_quant_of(image);
    if (opt.quant != MODEL_IMAGE_PLAIN && j->train.type != JOB_TRAIN_QLORA)
        rc = errf(err, "the model memory holds an NF4 base: only train.type qlora trains on it");
    if (rc == 0) rc = plan_memory(env, opt.quant, &opt, err);
    if (rc == 0) rc = fsdp_init(f, cfg, env->ctx, env->comm, env->rank, env->world, &opt, err);
    if (rc == 0) rc = fsdp_load_image(f, image, bytes, err);
    if (f->image) *image_out = (model_memory){image, bytes};
    else munmap((void *)image, bytes);
    if (rc) return rc;
    if (env->resume_dir) return resume(f, env, cfg, tokens_seen, err);
    if (!adapters) return 0;
    return j->lora.init_from[0] ? adapters_from(f, j, cfg, err) : fsdp_init_adapters(f, err);
}

typedef struct params_writer {
    st_wtensor *tensors;
    float **copies;
    int n;
} params_writer;

static int collect_tensor(const llama_tensor_slot *slot, const float *data, void *arg, errbuf *err) {
    params_writer *w = arg;
    float *copy = malloc(slot->numel * sizeof *copy);
    if (!copy) return errf(err, "out of memory copying %s", slot->name);
    memcpy(copy, data, slot->numel * sizeof *copy);
    st_wtensor *t = &w->tensors[w->n];
    *t = (st_wtensor){.name = slot->name, .dtype = ST_F32, .ndim = slot->ndim, .data = copy};
    memcpy(t->shape, slot->shape, sizeof slot->shape);
    w->copies[w->n++] = copy;
    return 0;
}

/* Fault final_params: every rank gathers, rank 0 writes the whole model as fp32 safetensors. */
static int write_final_params(fsdp *f, int rank, const char *path, errbuf *err) {
    int n = f->n_train_tensors;
    params_writer w = {calloc((size_t)n, sizeof *w.tensors), calloc((size_t)n, sizeof *w.copies), 0};
    int rc = (w.tensors && w.copies) ? fsdp_gather_params(f, collect_tensor, &w, err)
                                     : errf(err, "out of memory");
    if (rc == 0 && rank == 0) rc = st_write(path, w.tensors, w.n, NULL, 0, err);
    for (int i = 0; i < w.n; i++) free(w.copies[i]);
    free(w.tensors);
    free(w.copies);
    return rc;
}

static long total_steps(const job_config *j, const row_source *d) {
    if (j->train.max_steps > 0) return j->train.max_steps;
    return (long)row_source_steps_per_epoch(d) * j->train.epochs;
}

/* Whether a checkpoint follows step `done` (see train.h), from the votes every rank cast. */
static train_ckpt_action ckpt_due(const train_env *env, long done, long total,
                                  const fsdp_step_result *res, int64_t *served) {
    const job_config *j = env->job;
    if (!env->writer) return TRAIN_CKPT_NONE;
    int requested = res->vote_max[VOTE_REQUEST] > *served;
    int interval = j->checkpoint.interval_steps > 0 && done % j->checkpoint.interval_steps == 0;
    if ((done == total && j->checkpoint.save_final) || res->vote_max[VOTE_STOP] == TRAIN_STOP_SAVE) {
        *served = res->vote_max[VOTE_REQUEST];
        return TRAIN_CKPT_SYNC;
    }
    if (!requested && !interval)
        return res->vote_max[VOTE_MEMORY] && !res->vote_max[VOTE_BUSY] ? TRAIN_CKPT_MEMORY : TRAIN_CKPT_NONE;
    if (done == total) { /* the process ends after this step: no save in the background */
        *served = res->vote_max[VOTE_REQUEST];
        return TRAIN_CKPT_SYNC;
    }
    if (requested && res->vote_max[VOTE_SYNC] > *served) { /* a failed save's retry: now, in the foreground */
        *served = res->vote_max[VOTE_REQUEST];
        return TRAIN_CKPT_SYNC;
    }
    if (res->vote_max[VOTE_WRITING]) return TRAIN_CKPT_SKIPPED;
    if (requested) *served = res->vote_max[VOTE_REQUEST];
    return j->checkpoint.async ? TRAIN_CKPT_ASYNC : TRAIN_CKPT_SYNC;
}

/* Whether an evaluation follows step `done`: every train.eval_interval steps and after the
 * last, when samples are held out. */
static int eval_due(const job_config *j, const row_source *d, long done, long total) {
    if (d->n_eval == 0) return 0;
    return done == total || (j->train.eval_interval > 0 && done % j->train.eval_interval == 0);
}

static void progress(const train_env *env) {
    if (env->hooks.on_progress) env->hooks.on_progress(env->hooks.arg);
}

/* The mean token loss over the held-out samples: whole global batches, each rank its share,
 * in the training step's micro-batches. */
static int evaluate(fsdp *f, row_source *d, const train_env *env, row_batch *rows,
                    const fsdp_batch *batch, double *eval_loss, errbuf *err) {
    const job_config *j = env->job;
    double sum = 0;
    int64_t count = 0;
    for (uint64_t b = 0; b < row_source_eval_batches(d); b++) {
        double s;
        int64_t n;
        uint64_t first = b * (uint64_t)j->train.global_batch + (uint64_t)env->rank * (uint64_t)rows->n;
        row_source_fill_eval(d, first, rows);
        if (fsdp_eval_loss(f, batch, &s, &n, err)) return -1;
        progress(env);
        sum += s;
        count += n;
    }
    *eval_loss = count > 0 ? sum / (double)count : 0.0;
    return 0;
}

/* Whether the sample prompts are answered after step `done`: every train.sample_every steps,
 * else with each evaluation; and after the last step. */
static int samples_due(const train_env *env, const row_source *d, long done, long total) {
    const job_config *j = env->job;
    if (!env->samples) return 0;
    if (done == total) return 1;
    if (j->train.sample_every > 0) return done % j->train.sample_every == 0;
    return eval_due(j, d, done, total);
}

/* The greedy replies of the model after step `step` to the sample prompts (every rank
 * generates them together), reported by rank 0. */
static int answer_samples(fsdp *f, const train_env *env, long step, errbuf *err) {
    const msg_sample_prompts *s = env->samples;
    gen_prompt *prompts = malloc((size_t)s->n * sizeof *prompts);
    gen_reply *replies = calloc((size_t)s->n, sizeof *replies);
    int rc = prompts && replies ? 0 : errf(err, "out of memory");
    for (int i = 0; rc == 0 && i < s->n; i++)
        prompts[i] = (gen_prompt){s->ids + s->offsets[i], s->offsets[i + 1] - s->offsets[i]};
    gen_options o = {.max_new_tokens = env->job->train.sample_max_new_tokens, .stop_ids = s->stop,
                     .n_stop = s->n_stop, .sampling = {.greedy = 1}};
    if (rc == 0) rc = fsdp_generate(f, prompts, s->n, &o, replies, err);
    const train_hooks *h = &env->hooks;
    for (int i = 0; rc == 0 && env->rank == 0 && h->on_sample && i < s->n; i++)
        rc = h->on_sample(h->arg, step, i, replies[i].ids, replies[i].n, gen_stop_name(replies[i].stop));
    if (rc == 0) gen_replies_free(replies, s->n);
    free(prompts);
    free(replies);
    return rc ? errprefix(err, "samples after step %ld", step) : 0;
}

/* The seconds this rank has spent in collectives, on each of its communicators. */
static double comm_seconds(const fsdp *f) {
    return comm_busy_s(f->comm) + (f->shard_comm != f->comm ? comm_busy_s(f->shard_comm) : 0) +
           comm_busy_s(f->replica);
}

static int run_steps(fsdp *f, row_source *d, const train_env *env, int64_t tokens_seen, errbuf *err) {
    const job_config *j = env->job;
    const train_hooks *h = &env->hooks;
    int per = job_rows_per_sample(j), share = j->train.global_batch / env->world; /* samples */
    int T = j->data.seq_len, rows = share * per, micro = j->train.micro_batch * per, n_micro = rows / micro;
    long total = total_steps(j, d);
    int64_t served = 0; /* checkpoint requests served so far */
    row_batch rb;
    if (row_batch_init(&rb, rows, T, d->packing, err)) return -1;
    int64_t *samples = malloc((size_t)rows * sizeof *samples);
    int rc = samples ? 0 : errf(err, "out of memory for a batch of %d x %d", rows, T);
    /* the training batch; an evaluation's is the same rows without the sample keys */
    fsdp_batch batch = {.input_ids = rb.input_ids, .labels = rb.labels, .doc_start = rb.doc_start,
                        .doc_end = rb.doc_end, .samples = samples, .n_micro = n_micro,
                        .micro_batch = micro, .T = T};
    fsdp_batch eval_batch = batch;
    eval_batch.samples = NULL;
    fsdp_hparams hp = {.beta1 = j->train.betas[0], .beta2 = j->train.betas[1], .eps = j->train.eps,
                       .weight_decay = j->train.weight_decay, .clip_norm = j->train.clip_norm};
    int stop = 0;
    const fault *delay = fault_get(FAULT_STEP_DELAY, env->rank);
    memory_pace pace = {.step = f->step, .at = clock_now_s()};
    progress(env); /* the loop has begun: the stall watch starts */
    for (long step = f->step; rc == 0 && !stop && step < total; step++) {
        double top = clock_now_s(), comm0 = comm_seconds(f);
        if (delay) clock_sleep_s(delay->seconds);
        double t0 = clock_now_s();
        uint64_t first = (uint64_t)step * (uint64_t)j->train.global_batch + (uint64_t)env->rank * (uint64_t)share;
        row_source_fill(d, first, &rb);
        double data_s = clock_now_s() - t0;
        for (int r = 0; r < rows; r++) samples[r] = (int64_t)(first * (uint64_t)per + (uint64_t)r); /* dropout keys */
        hp.lr = schedule_lr(j, step, total);
        /* Stopping is voted too: every rank leaves after the same step (one leaving alone
         * would leave the others waiting in a collective).  Polled before the request: a
         * stop that comes with a checkpoint request (TRAIN_STOP_SAVE) is set after it. */
        f->vote[VOTE_STOP] = h->should_stop ? h->should_stop(h->arg) : 0;
        f->vote[VOTE_REQUEST] = h->ckpt_request ? h->ckpt_request(h->arg) : 0;
        f->vote[VOTE_SYNC] = h->ckpt_sync_request ? h->ckpt_sync_request(h->arg) : 0;
        f->vote[VOTE_WRITING] = env->writer && ckpt_writer_busy_disk(env->writer);
        f->vote[VOTE_BUSY] = env->writer && ckpt_writer_busy(env->writer);
        f->vote[VOTE_MEMORY] = memory_vote(env, &pace, step + 1);
        fsdp_step_result res;
        rc = fsdp_train_step(f, &batch, &hp, &res, err);
        if (rc) break;
        double iter_s = clock_now_s() - top, comm_s = comm_seconds(f) - comm0;
        progress(env);
        stop = res.vote_max[VOTE_STOP] != 0;
        tokens_seen += res.tokens;
        train_ckpt_action ckpt = ckpt_due(env, step + 1, total, &res, &served);
        double eval_loss = 0;
        int has_eval = eval_due(j, d, step + 1, total);
        if (has_eval && (rc = evaluate(f, d, env, &rb, &eval_batch, &eval_loss, err)) != 0) break;
        if (h->on_step) {
            train_step_info info = {.step = step + 1, .total_steps = total, .loss = res.loss,
                                    .lr = hp.lr, .grad_norm = res.grad_norm, .tokens = res.tokens,
                                    .seconds = clock_now_s() - t0, .iter_s = iter_s, .comm_s = comm_s,
                                    .data_s = data_s, .layer_forwards = f->layer_forwards,
                                    .all_gathers = f->param_gathers,
                                    .replica_collectives = (long)comm_calls(f->replica),
                                    .gathered_bytes = (int64_t)comm_gathered_bytes(f->shard_comm),
                                    .mem_bytes = (int64_t)k_bytes_in_use(f->ctx),
                                    .mem_peak_bytes = (int64_t)k_peak_bytes(f->ctx),
                                    .tokens_seen = tokens_seen, .ckpt = ckpt, .has_eval = has_eval,
                                    .eval_loss = eval_loss, .objective = j->train.objective,
                                    .ckpt_attempt = env->ckpt_attempt, .ckpt_request = served};
            memcpy(info.pref, res.pref, sizeof info.pref);
            h->on_step(h->arg, &info);
        }
        if (samples_due(env, d, step + 1, total) && (rc = answer_samples(f, env, step + 1, err)) != 0) break;
        if (ckpt == TRAIN_CKPT_ASYNC || ckpt == TRAIN_CKPT_SYNC || ckpt == TRAIN_CKPT_MEMORY) {
            double s0 = clock_now_s();
            rc = ckpt_writer_save(env->writer, f, step + 1, env->ckpt_attempt, ckpt == TRAIN_CKPT_SYNC,
                                  ckpt == TRAIN_CKPT_MEMORY, tokens_seen, err);
            pace = (memory_pace){.step = step + 1, .at = clock_now_s(), .stall_s = clock_now_s() - s0};
        }
        progress(env); /* the samples and the save, when there were */
    }
    row_batch_free(&rb);
    free(samples);
    return rc;
}

int train_run(const train_env *env, errbuf *err) {
    const job_config *j = env->job;
    fsdp f;
    row_source d;
    int64_t tokens_seen;
    model_memory image = {NULL, 0};
    if (load_model(&f, env, &image, &tokens_seen, err)) {
        fsdp_destroy(&f);
        unmap_model(&image);
        return TRAIN_ERR_SETUP;
    }
    int rc = env->writer ? ckpt_writer_prepare(env->writer, &f, err) : 0;
    if (rc == 0)
        rc = row_source_open(&d, j->data.path, j->data.seq_len, j->train.global_batch,
                             (uint64_t)j->train.seed, j->data.shuffle, j->data.packing,
                             j->data.eval_fraction, f.layout.cfg.vocab_size, err);
    if (rc == 0 && d.pairs != (j->train.objective != JOB_OBJECTIVE_SFT)) {
        rc = errf(err, "%s: %s, but train.objective is %s", j->data.path,
                  d.pairs ? "a cache of preference pairs" : "no cache of pairs",
                  d.pairs ? "sft" : "a preference objective (dpo, orpo)");
        row_source_close(&d);
    }
    if (rc) rc = TRAIN_ERR_SETUP;
    else {
        rc = run_steps(&f, &d, env, tokens_seen, err);
        row_source_close(&d);
    }
    const fault *final = fault_get(FAULT_FINAL_PARAMS, env->rank);
    if (rc == 0 && final) rc = write_final_params(&f, env->rank, final->path, err);
    fsdp_destroy(&f);
    unmap_model(&image);
    return rc;
}
