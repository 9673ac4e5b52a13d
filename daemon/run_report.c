/* run_report: the resolved job and derived values at the start, the summary at the end (F39);
 * see run_report.h. */
#include "daemon/run_report.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/path.h"
#include "daemon/ckpt_commit.h"
#include "daemon/host_memory.h"
#include "daemon/log.h"
#include "daemon/model_shm.h"
#include "kernels/kernels.h"
#include "model/llama.h"
#include "model/memory_plan.h"
#include "model/step_plan.h"
#include "proto/status.h"
#include "proto/lora_layout.h"
#include "proto/model_layout.h"

#ifndef FSDP_VERSION
#define FSDP_VERSION "unknown"
#endif
#ifndef FSDP_CUDA_ARCHS
#define FSDP_CUDA_ARCHS ""
#endif

static size_t layout_elems(int n_units, const llama_unit *u) {
    size_t n = 0;
    for (int i = 0; i < n_units; i++) n += u[i].numel;
    return n;
}

/* The parameters: the model's, and what is trained (the adapters, or everything). */
static int count_params(run_record *r, const job_config *j, const llama_config *cfg, errbuf *err) {
    llama_layout lo;
    if (llama_layout_init(&lo, cfg, err)) return -1;
    r->total_params = (int64_t)layout_elems(lo.n_units, lo.units);
    llama_layout_free(&lo);
    r->trainable_params = r->total_params;
    if (j->train.type == JOB_TRAIN_FULL) return 0;
    const lora_config lc = j->lora.config; /* job_resolve's */
    lora_layout la;
    if (lora_layout_init(&la, cfg, &lc, err)) return -1;
    r->trainable_params = (int64_t)layout_elems(la.n_units, la.units);
    lora_layout_free(&la);
    r->lora_rank = lc.rank;
    r->lora_alpha = lc.alpha;
    r->lora_scale = lora_scale(&lc);
    for (int m = 0; m < LORA_MODULES; m++)
        if (lc.targets & (1u << m))
            snprintf(r->lora_targets[r->n_lora_targets++], sizeof r->lora_targets[0], "%s", lora_module_name(m));
    return 0;
}

static double gib(int64_t b) { return (double)b / (double)(1ll << 30); }

/* The pinned host memory this node's workers will hold (fsdp.cpu_offload's shards,
 * fsdp.offload_activations' inputs), against what the node has left: refused now when it
 * cannot fit, not in a worker's allocation after the model has loaded. */
static int check_host_memory(const memory_plan *p, int workers, errbuf *err) {
    uint64_t each = p->host_offload + p->host_activations, need = (uint64_t)workers * each, have;
    const char *source;
    if (need == 0) return 0;
    if (host_memory_available(&have, &source, err)) return errprefix(err, "this node's memory");
    if (need <= have) return 0;
    const char *what = !p->host_offload ? "offloaded layer inputs"
                       : p->host_activations ? "fsdp.cpu_offload's masters, AdamW state and gradients, and offloaded layer inputs"
                                             : "fsdp.cpu_offload's masters, AdamW state and gradients";
    return errf(err, "not enough host memory: %d worker%s on this node would pin %.1f GiB (%" PRIu64 " bytes; "
                     "%.1f GiB each: %s), and the node has %.1f GiB (%" PRIu64 " bytes) available (%s); spread "
                     "the job over more GPUs or nodes (the shards shrink with the world) or run fewer workers a "
                     "node", workers, workers == 1 ? "" : "s", gib((int64_t)need), need, gib((int64_t)each), what,
                gib((int64_t)have), have, source);
}

/* The memory plan's peak a worker and its activation checkpointing, as the worker will plan
 * them (auto: within the GPU's memory, or runtime.gpu_memory_limit). */
static int plan_memory(run_record *r, const job_config *j, const llama_config *cfg, model_image_quant q,
                       errbuf *err) {
    int cuda = j->runtime.backend == JOB_BACKEND_CUDA;
    size_t budget = step_plan_auto_budget(j, cuda ? k_cuda_device_memory(0) : 0, cuda ? PLAN_CONTEXT_BYTES : 0);
    memory_plan_options o;
    memory_plan_job_options(j, cfg, (int)r->world_size, 0, j->train.type == JOB_TRAIN_FULL ? MODEL_IMAGE_PLAIN : q,
                            cuda ? 2 : 4, budget, &o);
    memory_plan p;
    errbuf why;
    if (memory_plan_compute(&o, &p, &why)) { /* the workers' own check says it; the block goes on */
        (void)err;
        snprintf(r->recompute, sizeof r->recompute, "not planned: %.160s", why.msg);
        return 0;
    }
    r->peak_gpu_bytes = (int64_t)p.total;
    llama_recompute_format(o.recompute, cfg->num_hidden_layers, r->recompute, sizeof r->recompute);
    return check_host_memory(&p, (int)r->workers_per_node, err);
}

static void set_dtypes(run_record *r, const job_config *j, model_image_quant q) {
    int cuda = j->runtime.backend == JOB_BACKEND_CUDA;
    const char *storage = j->model.dtype == JOB_DTYPE_BF16 ? "bf16" : "f32", *compute = cuda ? "bf16" : "f32";
    snprintf(r->storage_dtype, sizeof r->storage_dtype, "%s", storage);
    snprintf(r->compute_dtype, sizeof r->compute_dtype, "%s", compute);
    const char *base = q == MODEL_IMAGE_PLAIN || j->train.type == JOB_TRAIN_FULL ? "" : ", the base in NF4";
    if (!cuda && j->model.dtype == JOB_DTYPE_BF16)
        snprintf(r->dtypes, sizeof r->dtypes, "bf16 storage, fp32 compute%s (the CPU backend computes and "
                 "checkpoints in fp32)", base);
    else
        snprintf(r->dtypes, sizeof r->dtypes, "%s storage, %s compute, fp32 master%s", storage,
                 cuda ? "bf16" : "fp32", base);
}

int run_report_derive(run_record *r, const job_config *j, const llama_config *cfg, const json_t *config,
                      const char *resume_dir, long long resume_step, int nodes, int workers, int restart,
                      errbuf *err) {
    memset(r, 0, sizeof *r);
    snprintf(r->fsdpd_version, sizeof r->fsdpd_version, "%s", FSDP_VERSION);
    snprintf(r->cuda_archs, sizeof r->cuda_archs, "%s", FSDP_CUDA_ARCHS);
    r->started = (int64_t)time(NULL);
    const char *job_id = getenv("SLURM_JOB_ID");
    snprintf(r->job_id, sizeof r->job_id, "%s", job_id ? job_id : "");
    r->restart = restart;
    snprintf(r->backend, sizeof r->backend, "%s", j->runtime.backend == JOB_BACKEND_CUDA ? "cuda" : "cpu");
    r->nodes = nodes;
    r->workers_per_node = workers;
    r->world_size = (int64_t)nodes * workers;
    r->micro_batch = j->train.micro_batch;
    r->grad_accum = j->train.grad_accum;
    r->global_batch = j->train.global_batch;
    r->seq_len = j->data.seq_len;
    r->tokens_per_step = (int64_t)j->train.global_batch * j->data.seq_len;
    r->max_steps = j->train.max_steps;
    r->epochs = j->train.epochs;
    snprintf(r->train_type, sizeof r->train_type, "%s", job_train_type_name(j->train.type));
    model_image_quant q = MODEL_IMAGE_PLAIN;
    int bnb = 0;
    if (j->train.type != JOB_TRAIN_FULL && model_shm_quant(j, config, &q, &bnb, err)) return -1;
    snprintf(r->quant, sizeof r->quant, "%s", q == MODEL_IMAGE_PLAIN ? "none" : bnb ? "nf4-bnb" : "nf4");
    r->cpu_offload = j->fsdp.cpu_offload;
    r->offload_params = j->fsdp.offload_params;
    if (count_params(r, j, cfg, err) || plan_memory(r, j, cfg, q, err)) return -1;
    set_dtypes(r, j, q);
    snprintf(r->checkpoint_dir, sizeof r->checkpoint_dir, "%s", j->checkpoint.dir);
    snprintf(r->output_dir, sizeof r->output_dir, "%s", j->output.dir);
    snprintf(r->resume_from, sizeof r->resume_from, "%s", resume_dir ? resume_dir : "");
    r->resume_step = resume_dir && resume_dir[0] ? resume_step : 0;
    return 0;
}

/* ---- the block in the log ---- */

/* One line a section: key=value, a * after the keys set away from their defaults (the
 * defaults the job took: train.defaults). */
static int log_sections(const job_config *j, errbuf *err) {
    static job_config d;
    job_apply_profile(&d, j->train.defaults);
    json_t *have = job_to_object(j, err), *dflt = have ? job_to_object(&d, err) : NULL;
    if (!dflt) return json_decref(have), -1;
    const char *section;
    json_t *keys;
    json_object_foreach(have, section, keys) {
        char line[4096];
        size_t at = 0;
        const char *key;
        json_t *v;
        json_object_foreach(keys, key, v) {
            char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(12));
            int differs = !json_equal(v, json_object_get(json_object_get(dflt, section), key));
            int n = snprintf(line + at, sizeof line - at, "%s%s=%s%s", at ? " " : "", key, text ? text : "?",
                             differs ? "*" : "");
            free(text);
            if (n > 0) at = (size_t)n < sizeof line - at ? at + (size_t)n : sizeof line - 1;
        }
        log_event(-1, "job %s: %s", section, line);
    }
    json_decref(have);
    json_decref(dflt);
    return 0;
}


static void log_derived(const run_record *r, const job_config *j) {
    char spares[96] = "";
    if (j->runtime.spare_nodes > 0)
        snprintf(spares, sizeof spares, " (and %d spare node%s at the start: runtime.spare_nodes)", j->runtime.spare_nodes,
                 j->runtime.spare_nodes == 1 ? "" : "s");
    log_event(-1, "run: world size %lld = %lld node%s x %lld worker%s%s, backend %s", (long long)r->world_size,
              (long long)r->nodes, r->nodes == 1 ? "" : "s", (long long)r->workers_per_node,
              r->workers_per_node == 1 ? "" : "s", spares, r->backend);
    log_event(-1, "run: batch: micro-batch %lld x accumulation %lld x %lld ranks = global batch %lld sequences, "
              "%lld tokens a step (seq_len %lld)", (long long)r->micro_batch, (long long)r->grad_accum,
              (long long)r->world_size, (long long)r->global_batch, (long long)r->tokens_per_step,
              (long long)r->seq_len);
    if (r->max_steps > 0) log_event(-1, "run: steps: %lld (train.max_steps)", (long long)r->max_steps);
    else log_event(-1, "run: steps: %lld epoch%s (the step count once the data loads)", (long long)r->epochs,
                   r->epochs == 1 ? "" : "s");
    log_event(-1, "run: parameters: %lld trainable of %lld (%.4f%%), train.type %s", (long long)r->trainable_params,
              (long long)r->total_params, 100.0 * (double)r->trainable_params / (double)r->total_params,
              r->train_type);
    if (strcmp(r->train_type, "full")) {
        char targets[160] = "";
        size_t at = 0;
        for (int i = 0; i < r->n_lora_targets; i++) {
            int n = snprintf(targets + at, sizeof targets - at, "%s%s", i ? "," : "", r->lora_targets[i]);
            if (n > 0 && (size_t)n < sizeof targets - at) at += (size_t)n;
        }
        log_event(-1, "run: LoRA rank %lld, alpha %g, scale %g%s, dropout %g, targets %s; base quantization %s",
                  (long long)r->lora_rank, r->lora_alpha, r->lora_scale, j->lora.rslora ? " (rslora)" : "",
                  j->lora.dropout, targets, r->quant);
    }
    log_event(-1, "run: offload: %s; activation checkpointing: %s; memory plan peak %.2f GiB a %s (fsdp's "
              "allocations%s)", r->cpu_offload && r->offload_params ? "optimizer state and parameters"
                                : r->cpu_offload ? "optimizer state" : r->offload_params ? "parameters" : "none",
              r->recompute, gib(r->peak_gpu_bytes), strcmp(r->backend, "cuda") ? "worker" : "GPU",
              strcmp(r->backend, "cuda") ? "" : ", the CUDA context not counted");
    log_event(-1, "run: dtypes: %s", r->dtypes);
    log_event(-1, "run: checkpoints in %s, output in %s; resume: %s", r->checkpoint_dir, r->output_dir,
              r->resume_from[0] ? r->resume_from : "none (a fresh start)");
    log_event(-1, "run: fsdpd %s, CUDA archs %s; the job as resolved in %s/" RUN_JOB_FILE ", these values in %s/"
              RUN_RECORD_FILE, r->fsdpd_version, r->cuda_archs[0] ? r->cuda_archs : "none", r->output_dir,
              r->output_dir);
}

static int write_text(const char *dir, const char *name, const char *text, errbuf *err) {
    char path[PATH_BYTES];
    if (path_join(path, sizeof path, dir, name, err)) return -1;
    file_chunk c[2] = {{text, strlen(text)}, {"\n", 1}};
    return file_write_atomic(path, c, 2, err);
}

static int write_record(const run_record *r, errbuf *err) {
    char *text;
    if (run_record_to_json(r, &text, err)) return -1;
    int rc = write_text(r->output_dir, RUN_RECORD_FILE, text, err);
    free(text);
    return rc;
}

/* DIR/fsdpd-JOBID.output beside the status sockets (proto/status.h): where `fsdpctl status
 * --job-id ID` finds run.json once the job is over. */
static int leave_output_record(const job_config *j, errbuf *err) {
    status_place place;
    char path[PATH_BYTES], dir[PATH_MAX + 1];
    if (status_place_from_env(&place, err) || file_private_dir(place.dir, 1, err) ||
        status_output_record_path(path, sizeof path, place.dir, place.job_id, err))
        return -1;
    if (!realpath(j->output.dir, dir)) return errf(err, "%s: %s", j->output.dir, strerror(errno));
    size_t len = strlen(dir);
    dir[len] = '\n';
    file_chunk c = {dir, len + 1};
    return file_write_atomic_mode(path, &c, 1, 0600, err);
}

int run_report_start(const run_record *r, const job_config *j, errbuf *err) {
    log_event(-1, "the job as resolved (a * marks a key set away from its default; defaults: %s's):",
              job_profile_name(j->train.defaults));
    if (log_sections(j, err)) return -1;
    log_derived(r, j);
    json_t *o = job_to_object(j, err);
    if (!o) return -1;
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!text) return errf(err, "job.json: out of memory");
    int rc = write_text(j->output.dir, RUN_JOB_FILE, text, err);
    free(text);
    return rc || write_record(r, err) ? -1 : leave_output_record(j, err);
}

/* ---- progress ---- */

void run_report_note_step(run_progress *p, long long step, long long total_steps, double loss, long long tokens,
                          long long tokens_seen, double seconds) {
    int n = (int)(sizeof p->recent / sizeof p->recent[0]);
    p->recent[p->steps_run % n] = seconds;
    if (p->n_recent < n) p->n_recent++;
    p->steps_run++;
    p->last_step = step;
    p->total_steps = total_steps;
    p->last_loss = loss;
    p->tokens_run += tokens;
    p->tokens_seen = tokens_seen;
    p->seconds_run += seconds;
}

void run_report_note_eval(run_progress *p, long long step, double eval_loss) {
    if (!p->has_eval || eval_loss < p->best_eval) {
        p->best_eval = eval_loss;
        p->best_eval_step = step;
    }
    p->has_eval = 1;
    p->final_eval = eval_loss;
}

double run_report_eta(const run_progress *p) {
    if (p->n_recent == 0) return -1;
    double sum = 0;
    for (int i = 0; i < p->n_recent; i++) sum += p->recent[i];
    long long left = p->total_steps > p->last_step ? p->total_steps - p->last_step : 0;
    return sum / p->n_recent * (double)left;
}

void run_report_duration(double seconds, char *out, size_t n) {
    long long s = seconds > 0 ? llround(seconds) : 0;
    if (s >= 3600) snprintf(out, n, "%lldh%02lldm%02llds", s / 3600, s / 60 % 60, s % 60);
    else if (s >= 60) snprintf(out, n, "%lldm%02llds", s / 60, s % 60);
    else snprintf(out, n, "%llds", s);
}

/* ---- the summary ---- */

static int by_name(const void *a, const void *b) { return strcmp(a, b); }

/* The committed checkpoints in checkpoint.dir (step-N, no .partial), oldest first. */
static void list_checkpoints(run_summary *s, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && s->n_checkpoints < RUN_MAX_KEPT) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) || strtoll(e->d_name + 5, &end, 10) < 0 || *end ||
            strlen(e->d_name) >= sizeof s->checkpoints[0])
            continue;
        strcpy(s->checkpoints[s->n_checkpoints++], e->d_name);
    }
    closedir(d);
    qsort(s->checkpoints, (size_t)s->n_checkpoints, sizeof s->checkpoints[0], by_name);
}

/* A GPU's dense bf16 peak (model/step_plan.h's table), the one whose memory is nearest this
 * device's; 0 without one. */
static double peak_tflops(const char **name) {
    size_t have = k_cuda_device_memory(0);
    if (!have) return 0;
    char names[256];
    snprintf(names, sizeof names, "%s", plan_gpu_names());
    const plan_gpu *best = NULL;
    char *save = NULL;
    for (char *t = strtok_r(names, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        const plan_gpu *g = plan_gpu_find(t);
        if (g && (!best || fabs(g->memory_gib * (1 << 30) - (double)have) <
                               fabs(best->memory_gib * (1 << 30) - (double)have)))
            best = g;
    }
    if (best) *name = best->name;
    return best ? best->tflops : 0;
}

/* The model FLOPs of a token (6 N for a full fine-tune; the frozen base's forward and input
 * gradients, 4 N, and 6 a trained adapter parameter; attention's 12 x layers x hidden x seq_len). */
static double flops_per_token(const run_record *r, const llama_config *cfg) {
    double attn = 12.0 * cfg->num_hidden_layers * cfg->hidden_size * (double)r->seq_len;
    if (!strcmp(r->train_type, "full")) return 6.0 * (double)r->total_params + attn;
    return 4.0 * (double)r->total_params + 6.0 * (double)r->trainable_params + attn;
}

int run_report_finish(run_record *r, const job_config *j, const run_progress *p, errbuf *err) {
    run_summary *s = &r->summary;
    memset(s, 0, sizeof *s);
    r->has_summary = true;
    s->ended = (int64_t)time(NULL);
    s->steps = p->last_step;
    s->tokens = p->tokens_seen;
    s->tokens_computed = p->steps_run * r->tokens_per_step;
    s->wall_s = clock_now_s() - p->started;
    s->tokens_per_s = p->seconds_run > 0 ? (double)p->tokens_run / p->seconds_run : 0;
    s->final_loss = p->last_loss;
    s->has_eval = p->has_eval;
    s->final_eval_loss = p->final_eval;
    s->best_eval_loss = p->best_eval;
    s->best_eval_step = p->best_eval_step;
    list_checkpoints(s, j->checkpoint.dir);
    s->adapter = j->train.type != JOB_TRAIN_FULL && !j->output.merge;
    const char *gpu = NULL;
    double peak = strcmp(r->backend, "cuda") ? 0 : peak_tflops(&gpu);
    llama_config cfg;
    json_t *config = NULL;
    errbuf why;
    if (peak > 0 && p->seconds_run > 0 && ckpt_job_model_config(j, &config, &cfg, &why) == 0) {
        s->has_mfu = true;
        s->mfu = flops_per_token(r, &cfg) * (double)s->tokens_computed / p->seconds_run /
                 ((double)r->world_size * peak * 1e12);
    }
    json_decref(config);
    if (!j->output.consolidate) snprintf(s->load, sizeof s->load, "(output.consolidate is false: no model "
                                                                   "in %s; fsdpctl consolidate %s OUT)",
                                         r->output_dir, j->checkpoint.dir);
    else if (s->adapter)
        snprintf(s->load, sizeof s->load, "PeftModel.from_pretrained(base, \"%s\")", r->output_dir);
    else
        snprintf(s->load, sizeof s->load, "AutoModelForCausalLM.from_pretrained(\"%s%s\")", r->output_dir,
                 j->output.merge ? "/merged" : "");
    char wall[32], kept[RUN_MAX_KEPT * 24] = "";
    run_report_duration(s->wall_s, wall, sizeof wall);
    size_t at = 0;
    for (int i = 0; i < s->n_checkpoints; i++) {
        int n = snprintf(kept + at, sizeof kept - at, "%s%s", i ? ", " : "", s->checkpoints[i]);
        if (n > 0 && (size_t)n < sizeof kept - at) at += (size_t)n;
    }
    log_event(-1, "summary: %lld steps, %lld tokens (%lld computed this run), %s, %.0f tokens/s", (long long)s->steps,
              (long long)s->tokens, (long long)s->tokens_computed, wall, s->tokens_per_s);
    if (s->has_mfu) log_event(-1, "summary: MFU %.1f%% (model FLOPs against %s's dense bf16 peak)", 100 * s->mfu, gpu);
    log_event(-1, "summary: final loss %.4f", s->final_loss);
    if (s->has_eval)
        log_event(-1, "summary: eval loss %.4f at the end, best %.4f after step %lld", s->final_eval_loss,
                  s->best_eval_loss, (long long)s->best_eval_step);
    log_event(-1, "summary: checkpoints kept in %s: %s", j->checkpoint.dir, s->n_checkpoints ? kept : "none");
    log_event(-1, "summary: output in %s; load it with %s", r->output_dir, s->load);
    if (s->adapter)
        log_event(-1, "summary: (base = AutoModelForCausalLM.from_pretrained(\"%s\"))", j->model.path);
    return write_record(r, err);
}
