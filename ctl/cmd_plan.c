/* fsdpctl plan: what a job needs and takes, before it is submitted (model/step_plan.h). */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/path.h"
#include "daemon/ckpt_commit.h"
#include "proto/job_flags.h"
#include "daemon/data_prepare.h"
#include "ctl/fsdpctl.h"
#include "daemon/model_shm.h"
#include "model/step_plan.h"
#include "proto/plan_rates.h"

static void plan_usage(FILE *f) {
    fprintf(f, "usage: fsdpctl plan JOB.json [--nodes N] [--gpus-per-node G] [--gpu NAME] [--rates FILE]\n"
               "                    [--net-gbps X] [--longest] [--json] [--section.key=value ...]\n"
               "  the job's device memory a GPU, host RAM a node, checkpoint size and write time,\n"
               "  step time and tokens/s, and the largest micro_batch that fits, on N nodes of G\n"
               "  GPUs (default 1 x 8) of NAME (%s; default h200), with\n"
               "  runtime.workers_per_node workers a node (0: one a GPU), and whether fsdpd admits\n"
               "  it (its own check: DOES NOT FIT with fsdpd's reason).  runtime.backend as the job\n"
               "  says (auto: cuda); cpu plans the workers' memory and host RAM, with no step time.\n"
               "  FILE: the rates table (default configs/plan/h200.json beside this program's\n"
               "  build, measured by bench/plan_rates.c); other GPUs than its own are scaled from\n"
               "  datasheets and marked unvalidated.  X: a node's network bandwidth across nodes,\n"
               "  GB/s (default 50: 400 Gb/s of EFA).  --longest: also the longest data.seq_len\n"
               "  fsdpd admits with the job's other settings, up to the positions the model's\n"
               "  config covers.  Overrides as fsdpd takes them.\n",
            plan_gpu_names());
}

typedef struct plan_args {
    const char *job, *gpu, *rates;
    int nodes, gpus, json, longest;
    int spares; /* of --nodes, the job's runtime.spare_nodes (nodes: the ones that train) */
    double net_gbps;
    char **overrides;
    int n_overrides;
} plan_args;

/* Returns 0 to go on, or -1 to stop with *status (0 after --help, 2 for bad usage). */
static int parse_args(int argc, char **argv, plan_args *a, int *status) {
    *a = (plan_args){.gpu = "h200", .nodes = 1, .gpus = 8, .net_gbps = 50};
    *status = 2;
    a->overrides = calloc((size_t)argc, sizeof *a->overrides);
    if (!a->overrides) return fprintf(stderr, "fsdpctl plan: out of memory\n"), -1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            plan_usage(stdout);
            *status = 0;
            return -1;
        } else if (!strcmp(s, "--json")) {
            a->json = 1;
            continue;
        } else if (!strcmp(s, "--longest")) {
            a->longest = 1;
            continue;
        } else if (!strcmp(s, "--nodes") && v) {
            bad = fsdpctl_parse_int(v, 1, 65536, &a->nodes);
        } else if (!strcmp(s, "--gpus-per-node") && v) {
            bad = fsdpctl_parse_int(v, 1, 64, &a->gpus);
        } else if (!strcmp(s, "--gpu") && v) {
            a->gpu = v;
        } else if (!strcmp(s, "--rates") && v) {
            a->rates = v;
        } else if (!strcmp(s, "--net-gbps") && v) {
            char *end;
            a->net_gbps = strtod(v, &end);
            bad = *end || !(a->net_gbps > 0 && a->net_gbps < 1e6);
        } else if (!strncmp(s, "--", 2) && strchr(s, '=')) {
            a->overrides[a->n_overrides++] = argv[i];
            continue;
        } else if (s[0] != '-' && !a->job) {
            a->job = s;
            continue;
        } else {
            if (!strncmp(s, "--", 2) && !v && strcmp(s, "--json"))
                fprintf(stderr, "fsdpctl plan: %s needs a value\n", s);
            else if (!strncmp(s, "--", 2) && strchr(s + 2, '.'))
                fprintf(stderr, "fsdpctl plan: %s: an override is --section.key=value, with '='\n", s);
            else fprintf(stderr, "fsdpctl plan: %s: %s\n", s, s[0] == '-' ? "unknown flag" : "unexpected argument");
            plan_usage(stderr);
            return -1;
        }
        if (bad) return fprintf(stderr, "fsdpctl plan: %s '%s' is out of range\n", s, v), -1;
        i++;
    }
    if (!a->job) {
        plan_usage(stderr);
        return -1;
    }
    return 0;
}

/* configs/plan/h200.json beside the build this program is in (BUILD/fsdpctl -> ./configs). */
static void default_rates(char *out, size_t n) {
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    snprintf(out, n, "configs/plan/h200.json");
    if (len <= 0) return;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = '\0';
    char candidate[PATH_MAX + 64];
    int len2 = snprintf(candidate, sizeof candidate, "%s/../configs/plan/h200.json", exe);
    if (len2 > 0 && (size_t)len2 < n && access(candidate, R_OK) == 0) memcpy(out, candidate, (size_t)len2 + 1);
}

static double gib(size_t b) { return (double)b / (double)(1ull << 30); }

/* --longest: the longest data.seq_len, up to the positions cfg covers, whose plan fsdpd admits
 * with j's other settings (what a worker needs grows with it: a binary search); 0: none. */
static int longest_seq_len(const job_config *j, const llama_config *cfg, model_image_quant q, const plan_machine *m,
                           const plan_rates *r) {
    static job_config alt;
    static step_plan p;
    alt = *j;
    int64_t covered = llama_config_max_positions(cfg);
    int lo = 1, hi = covered < (1 << 20) ? (int)covered : 1 << 20;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        errbuf ignored;
        alt.data.seq_len = mid;
        if (step_plan_job(&alt, cfg, q, m, r, &p, &ignored) == 0 && p.fits) lo = mid;
        else hi = mid - 1;
    }
    return lo >= 2 ? lo : 0;
}

static void print_verdict(const step_plan *p) {
    if (!p->fits) printf("  fsdpd refuses it: %s\n", p->verdict);
}

static void print_text(const plan_args *a, const job_config *j, int n_layers, const plan_rates *r,
                       const step_plan *p, const plan_machine *m) {
    int w = m->gpus_per_node;
    if (a->spares) printf("fsdpctl plan: %d of the %d nodes train; %d wait as spares (runtime.spare_nodes)\n", a->nodes,
                          a->nodes + a->spares, a->spares);
    if (p->cpu) {
        printf("fsdpctl plan: %s on %d node%s x %d worker%s, CPU backend (memory and host RAM; no step time)\n",
               a->job, a->nodes, a->nodes == 1 ? "" : "s", w, w == 1 ? "" : "s");
        printf("per worker: %.1f GiB of host memory%s%s\n", gib(p->mem.total),
               j->runtime.gpu_memory_limit > 0 ? " (runtime.gpu_memory_limit applies)" : "",
               p->fits ? "" : ": DOES NOT FIT");
    } else {
        printf("fsdpctl plan: %s on %d node%s x %d %s GPU%s, %d worker%s a node (%s)\n", a->job, a->nodes,
               a->nodes == 1 ? "" : "s", a->gpus, m->gpu->name, a->gpus == 1 ? "" : "s", w, w == 1 ? "" : "s",
               p->validated ? "rates measured on this GPU" : "unvalidated: the rates scaled from datasheets");
        printf("per GPU: %.1f GiB of %.1f (fsdp's %.1f GiB + the CUDA context %.1f GiB)%s\n", gib(p->gpu_bytes),
               m->gpu->memory_gib, gib(p->mem.total), gib(p->context), p->fits ? "" : ": DOES NOT FIT");
    }
    print_verdict(p);
    printf("  parameters %.1f GiB, gradients %.1f GiB, optimizer state %.1f GiB, gathered units %.1f GiB,\n"
           "  activations %.1f GiB, workspaces %.1f GiB%s\n", gib(p->params), gib(p->grads), gib(p->optimizer),
           gib(p->gathered), gib(p->activations), gib(p->workspace),
           p->mem.load_staging ? " (loading the base: +0.1 GiB of staging)" : "");
    if (p->mem.host_offload) printf("  offloaded to host memory: %.1f GiB a worker\n", gib(p->mem.host_offload));
    if (j->fsdp.offload_activations)
        printf("  fsdp.offload_activations: %d of %d layer inputs in host memory, %.1f GiB a worker\n",
               p->offload_layers, n_layers, gib(p->mem.host_activations));
    char recompute[160];
    llama_recompute_format(p->recompute, n_layers, recompute, sizeof recompute);
    printf("  activation checkpointing: %s\n", recompute);
    if (p->compute_copies)
        printf("  compute copies: the trained weights in %s beside their masters (%.1f GiB a worker), "
               "written by AdamW: no cast at each use\n", p->cpu ? "fp32" : "bf16",
               gib(p->mem.trainable_elems * (p->cpu ? 4 : 2)));
    printf("  largest train.micro_batch that fits: %d (the job's: %d)\n", p->max_micro_batch, j->train.micro_batch);
    if (j->train.objective != JOB_OBJECTIVE_SFT)
        printf("  train.objective %s: a micro-batch of %d pair%s is %d rows%s\n", job_objective_name(j->train.objective),
               j->train.micro_batch, j->train.micro_batch == 1 ? "" : "s", 2 * j->train.micro_batch,
               j->train.objective != JOB_OBJECTIVE_DPO ? ""
               : j->train.type == JOB_TRAIN_FULL ? "; the reference, a frozen copy of the start weights, is in the parameters"
                                                  : "; the reference is the base, the adapters off");
    printf("host RAM a node: %.1f GiB: model memory %.1f, offloaded state %.1f, checkpoint staging %.1f, "
           "token cache %.1f, processes %.1f\n", gib(p->host_total), gib(p->host_model), gib(p->host_offload),
           gib(p->host_ckpt), gib(p->host_data), gib(p->host_processes));
    if (p->cpu) printf("  the workers' memory: %.1f GiB (included)\n", gib(p->host_workers));
    if (p->host_memory_ckpt)
        printf("  in-memory checkpoints (checkpoint.memory_interval_steps %d): the staging is their first image; "
               "a second, %.1f GiB, where it fits in half the node's free memory\n",
               j->checkpoint.memory_interval_steps, gib(p->host_memory_ckpt));
    if (r)
        printf("checkpoint: %.1f GB in all, %.1f GB a node, %.1f s to write at %.2f GB/s\n", p->ckpt_bytes / 1e9,
               p->ckpt_node_bytes / 1e9, p->ckpt_write_s, r->disk_gbps);
    else
        printf("checkpoint: %.1f GB in all, %.1f GB a node\n", p->ckpt_bytes / 1e9, p->ckpt_node_bytes / 1e9);
    if (p->cpu) return;
    printf("step: %.3f s, %.0f tokens/s (%.0f a GPU): GEMMs %.3f s, attention %.3f s, other kernels %.3f s, "
           "communication %.3f s of which %.3f exposed, offload exposed %.3f s, optimizer %.3f s\n",
           p->step_s, p->tokens_per_s, p->tokens_per_s / (a->nodes * w), p->gemm_s, p->attention_s,
           p->memory_s, p->comm_s, p->comm_exposed_s, p->offload_exposed_s, p->optimizer_s);
    if (j->train.objective == JOB_OBJECTIVE_DPO)
        printf("  of which DPO's reference forward (no backward) and its gathers: %.3f s\n", p->reference_s);
    if (j->train.precision == JOB_PRECISION_FP8) /* the table has no FP8 GEMM rates yet */
        printf("  train.precision fp8: the step is predicted at bf16's GEMM rates, without FP8's casts "
               "(measured on an H200: 1.09x bf16's tokens/s for Llama-2-7B, bench/NOTES.md)\n");
}

static int print_json(const plan_args *a, const step_plan *p, const plan_machine *m, int longest) {
    json_t *o = json_pack(
        "{s:s, s:s, s:i, s:i, s:i, s:s?, s:b, s:b, s:s?, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, "
        "s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:f}, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, "
        "s:i, s:{s:i, s:s}, s:{s:i, s:I}, s:b}",
        "job", a->job, "backend", p->cpu ? "cpu" : "cuda", "nodes", a->nodes, "gpus_per_node", p->cpu ? 0 : a->gpus,
        "workers_per_node", m->gpus_per_node, "gpu", p->cpu ? NULL : m->gpu->name, "validated", p->validated,
        "fits", p->fits, "refused", p->fits ? NULL : p->verdict,
        "gpu_memory", "total", (json_int_t)p->gpu_bytes, "fsdp", (json_int_t)p->mem.total, "context",
        (json_int_t)p->context, "parameters", (json_int_t)p->params, "gradients", (json_int_t)p->grads,
        "optimizer", (json_int_t)p->optimizer, "gathered", (json_int_t)p->gathered, "activations",
        (json_int_t)p->activations, "workspaces", (json_int_t)p->workspace, "load_staging",
        (json_int_t)p->mem.load_staging, "offloaded", (json_int_t)p->mem.host_offload,
        "host_memory", "total", (json_int_t)p->host_total, "model", (json_int_t)p->host_model, "offloaded",
        (json_int_t)p->host_offload, "workers", (json_int_t)p->host_workers, "checkpoint_staging",
        (json_int_t)p->host_ckpt, "memory_checkpoint_second_image", (json_int_t)p->host_memory_ckpt,
        "token_cache", (json_int_t)p->host_data, "processes", (json_int_t)p->host_processes,
        "checkpoint", "bytes", (json_int_t)p->ckpt_bytes, "node_bytes", (json_int_t)p->ckpt_node_bytes,
        "write_s", p->ckpt_write_s,
        "step", "seconds", p->step_s, "tokens_per_s", p->tokens_per_s, "gemm_s", p->gemm_s, "attention_s",
        p->attention_s, "other_kernels_s", p->memory_s, "communication_s", p->comm_s, "communication_exposed_s",
        p->comm_exposed_s, "offload_exposed_s", p->offload_exposed_s, "optimizer_s", p->optimizer_s, "reference_s", p->reference_s,
        "max_micro_batch", p->max_micro_batch, "activation_checkpointing", "recomputed_layers", p->recompute.layers,
        "they_keep", llama_keep_name(p->recompute.keep),
        "offload_activations", "layers", p->offload_layers, "host_bytes", (json_int_t)p->mem.host_activations,
        "compute_copies", p->compute_copies);
    if (!o) return fprintf(stderr, "fsdpctl plan: out of memory\n"), 1;
    if (longest >= 0 && json_object_set_new(o, "longest_seq_len", json_integer(longest)))
        return json_decref(o), fprintf(stderr, "fsdpctl plan: out of memory\n"), 1;
    if (json_object_set_new(o, "spare_nodes", json_integer(a->spares)))
        return json_decref(o), fprintf(stderr, "fsdpctl plan: out of memory\n"), 1;
    /* the CPU backend: no step time (the rates are a GPU's), no GPU */
    if (p->cpu && json_object_set_new(o, "step", json_null())) return json_decref(o), fprintf(stderr, "fsdpctl plan: out of memory\n"), 1;
    int rc = json_dumpf(o, stdout, JSON_INDENT(2)) == 0 && printf("\n") > 0 ? 0 : 1;
    json_decref(o);
    return rc;
}

/* The job as fsdpd would run it on a.nodes nodes of a.gpus GPUs: its runtime.backend (auto: cuda,
 * the machine planned has GPUs) and runtime.workers_per_node (0: one a GPU; 2 on cpu), resolved
 * by job_resolve_runtime as fsdpd resolves them; its data file checked as fsdpd checks it. */
static int load_job(plan_args *a, job_config *j, errbuf *err) {
    if (job_load(j, a->job, err)) return -1;
    for (int i = 0; i < a->n_overrides; i++)
        if (job_apply_override(j, a->overrides[i], err)) return -1;
    if (j->runtime.backend == JOB_BACKEND_AUTO) j->runtime.backend = JOB_BACKEND_CUDA;
    int cuda = j->runtime.backend == JOB_BACKEND_CUDA;
    if (job_resolve_runtime(j, cuda ? a->gpus : 0, err)) return -1;
    if (cuda && j->runtime.workers_per_node > a->gpus)
        return errf(err, "runtime.workers_per_node: %d workers on %d GPUs a node share them, which the plan does "
                         "not model (plan at most one worker a GPU: --gpus-per-node)", j->runtime.workers_per_node,
                    a->gpus);
    if (j->runtime.spare_nodes >= a->nodes)
        return errf(err, "runtime.spare_nodes: %d spare(s) of --nodes %d leave none to train", j->runtime.spare_nodes,
                    a->nodes);
    a->spares = j->runtime.spare_nodes;
    a->nodes -= a->spares; /* the spares hold no rank */
    int world = a->nodes * j->runtime.workers_per_node;
    if (job_resolve(j, world, err) || job_validate(j, world, err) || data_check(j, err)) return -1;
    return 0;
}

static size_t data_bytes(const job_config *j) {
    struct stat st;
    return j->data.format == JOB_DATA_TOKENS && stat(j->data.path, &st) == 0 ? (size_t)st.st_size : 0;
}

int cmd_plan(int argc, char **argv) {
    plan_args a;
    int status;
    if (parse_args(argc, argv, &a, &status)) {
        free(a.overrides);
        return status;
    }
    static job_config j;
    errbuf err = {{0}};
    char rates_path[PATH_MAX];
    if (a.rates) snprintf(rates_path, sizeof rates_path, "%s", a.rates);
    else default_rates(rates_path, sizeof rates_path);
    plan_rates r = {0};
    json_t *config = NULL;
    llama_config cfg;
    model_image_quant q = MODEL_IMAGE_PLAIN;
    int bnb = 0, rc = 1;
    plan_machine m = {.nodes = a.nodes, .gpus_per_node = a.gpus, .gpu = plan_gpu_find(a.gpu), .net_gbps = a.net_gbps};
    step_plan p;
    int cpu = 0;
    if (!m.gpu) {
        fprintf(stderr, "fsdpctl plan: --gpu '%s' is none of %s\n", a.gpu, plan_gpu_names());
    } else if (load_job(&a, &j, &err) || ckpt_job_model_config(&j, &config, &cfg, &err) ||
               (j.train.type != JOB_TRAIN_FULL && model_shm_quant(&j, config, &q, &bnb, &err)) ||
               /* the CPU backend reads the rates only for the checkpoint's write time, when asked */
               ((!(cpu = j.runtime.backend == JOB_BACKEND_CPU) || a.rates) && plan_rates_load(&r, rates_path, &err))) {
        fprintf(stderr, "fsdpctl plan: %s\n", err.msg);
    } else {
        const plan_rates *rates = cpu && !a.rates ? NULL : &r;
        m.nodes = a.nodes;
        m.data_bytes = data_bytes(&j);
        m.gpus_per_node = j.runtime.workers_per_node;
        if (cpu) m.gpu = NULL;
        int longest = -1; /* not asked */
        if (step_plan_job(&j, &cfg, q, &m, rates, &p, &err)) {
            fprintf(stderr, "fsdpctl plan: %s\n", err.msg);
        } else {
            if (a.longest) longest = longest_seq_len(&j, &cfg, q, &m, rates);
            if (a.json) rc = print_json(&a, &p, &m, longest);
            else print_text(&a, &j, cfg.num_hidden_layers, rates, &p, &m), rc = 0;
            if (!a.json && longest >= 0)
                printf("longest data.seq_len that fits: %d (the config covers %lld positions)\n", longest,
                       (long long)llama_config_max_positions(&cfg));
        }
    }
    json_decref(config);
    plan_rates_free(&r);
    free(a.overrides);
    return rc;
}
