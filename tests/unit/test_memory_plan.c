/* model/memory_plan against worker/fsdp: the plan's total is k_peak_bytes of a fresh CPU
 * context after fsdp_init, fsdp_load_image, (adapters) fsdp_init_adapters and one
 * fsdp_train_step, for full fine-tunes, LoRA and QLoRA (NF4 with and without double
 * quantization), one and two ranks (forked, TCP), activation checkpointing on and off, tied
 * embeddings and no_shard: the test fails as soon as fsdp.c's allocations and the plan
 * diverge.  Some categories are computed by hand, and memory_plan_check_job's message and
 * suggestions are checked against the plans of the settings it suggests. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/memory_plan.h"
#include "proto/rng.h"
#include "worker/comm.h"
#include "worker/fsdp.h"

enum { MICRO = 2, N_MICRO = 2, T = 12 };

/* lib.sh's small model with hidden 35: the embedding (61 x 35) is odd, so two ranks pad it. */
static llama_config small_config(int tied) {
    llama_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 35;
    c.intermediate_size = 70;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 10;
    c.vocab_size = 61;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = tied;
    c.bos_token_id = c.eos_token_id = -1;
    c.rope = (rope_config){.type = ROPE_DEFAULT, .theta = 10000.0};
    return c;
}

static const lora_config small_lora = {.rank = 3, .alpha = 6, .dropout = 0.1, .targets = LORA_ALL_LINEAR};
static const lora_config small_lora_no_dropout = {.rank = 3, .alpha = 6, .targets = LORA_ALL_LINEAR};

typedef enum kind { FULL, LORA, QLORA, QLORA_SINGLE } kind;
static const char *const kind_names[] = {"full", "lora", "qlora", "qlora (NF4, single quantization)"};

/* Activation checkpointing of a case (ckpt): none, full, selective, the two mixes of auto
 * on the 2-layer model (the last layer whole, the first its attention or its input), and
 * every layer or the first keeping its input and h, or also the attention's output. */
static const llama_recompute recomputes[] = {
    {0, LLAMA_KEEP_ALL}, {2, LLAMA_KEEP_INPUT}, {2, LLAMA_KEEP_ATTENTION},
    {1, LLAMA_KEEP_ATTENTION}, {1, LLAMA_KEEP_INPUT}, {2, LLAMA_KEEP_RESIDUAL}, {1, LLAMA_KEEP_RESIDUAL},
    {2, LLAMA_KEEP_CONTEXT}, {1, LLAMA_KEEP_CONTEXT}};
#define N_RECOMPUTES ((int)(sizeof recomputes / sizeof recomputes[0]))

typedef struct plan_case {
    kind kind;
    int world, ckpt, tied; /* ckpt: an index of recomputes */
    job_sharding sharding;
    int cpu_offload, offload_params;
    llama_family family; /* F43: Qwen2's biases, Qwen3's q/k norms, Mistral's window */
    job_objective objective; /* a preference objective: MICRO rows a micro-batch, pairs */
    int offload_layers;      /* fsdp.offload_activations' layer inputs on the host (full recompute) */
    int mlp_chunk;           /* fsdp.mlp_chunk (the adapters without dropout) */
    int fp8;                 /* train.precision fp8 (a full fine-tune of 3 layers: the middle one's); 2:
                                with train.fp8_all_gather */
    int copies;              /* fsdp_options.compute_copies */
} plan_case;

/* The model of a case: small_config in the case's family. */
static llama_config config_of(const plan_case *pc) {
    llama_config c = small_config(pc->tied);
    c.family = pc->family;
    c.attention_bias = pc->family == FAMILY_QWEN2;
    c.qk_norm = pc->family == FAMILY_QWEN3;
    c.sliding_window = pc->family == FAMILY_MISTRAL ? 5 : 0;
    if (pc->fp8) c.num_hidden_layers = 3; /* the first and the last stay in the compute dtype */
    return c;
}

static model_image_quant quant_of(kind k) {
    return k == QLORA ? MODEL_IMAGE_NF4_DQ : k == QLORA_SINGLE ? MODEL_IMAGE_NF4 : MODEL_IMAGE_PLAIN;
}

static memory_plan_options options_of(const plan_case *pc, const llama_config *cfg, int rank) {
    return (memory_plan_options){.model = cfg, .sharding = pc->sharding, .world = pc->world, .group = pc->world,
                                 .rank = rank,
                                 .lora = pc->kind == FULL ? NULL : pc->mlp_chunk ? &small_lora_no_dropout : &small_lora,
                                 .quant = quant_of(pc->kind), .recompute = recomputes[pc->ckpt],
                                 .micro_batch = MICRO, .seq_len = T, .compute_size = sizeof(float),
                                 .cpu_offload = pc->cpu_offload, .offload_params = pc->offload_params,
                                 .objective = pc->objective, .offload_layers = pc->offload_layers,
                                 .mlp_chunk = pc->mlp_chunk, .fp8 = pc->fp8 != 0, .fp8_all_gather = pc->fp8 == 2,
                                 .compute_copies = pc->copies};
}

/* What one rank saw. */
typedef struct rank_report {
    int ok;
    size_t peak, planned;
    char msg[sizeof(errbuf)];
} rank_report;

/* A random model image of pc's quantization (what fsdpd hands the workers). */
static void *model_image(const plan_case *pc, const llama_layout *lo, errbuf *err) {
    model_image_quant q = quant_of(pc->kind);
    void *image = calloc(1, model_image_bytes_q(lo, MODEL_IMAGE_F32, q));
    if (!image) {
        errf(err, "out of memory");
        return NULL;
    }
    int rc = q == MODEL_IMAGE_PLAIN
                 ? model_image_fill_random(image, lo, MODEL_IMAGE_F32, 5, NULL, NULL, err)
                 : model_image_fill_nf4(image, lo, MODEL_IMAGE_F32, q, NULL, 0, 5, NULL, NULL, err);
    if (rc == 0) return image;
    free(image);
    return NULL;
}

/* The worker's sequence, then one step of MICRO x N_MICRO rows; *image: the model image,
 * which offload_params reads until fsdp_destroy. */
static int train_one_step(fsdp *f, const plan_case *pc, int rank, void **image, errbuf *err) {
    const llama_config *cfg = &f->layout.cfg;
    model_image_quant q = quant_of(pc->kind);
    if (!(*image = model_image(pc, &f->layout, err)) ||
        fsdp_load_image(f, *image, model_image_bytes_q(&f->layout, MODEL_IMAGE_F32, q), err) ||
        (pc->kind != FULL && fsdp_init_adapters(f, err)))
        return -1;
    int32_t ids[MICRO * N_MICRO * T], labels[MICRO * N_MICRO * T];
    for (int i = 0; i < MICRO * N_MICRO * T; i++) {
        ids[i] = labels[i] = (int32_t)(rng_u64(9, (uint64_t)rank, (uint64_t)i) % (uint64_t)cfg->vocab_size);
        if (pc->objective != JOB_OBJECTIVE_SFT && i % T < T / 2) labels[i] = K_IGNORE_INDEX; /* the prompt */
    }
    fsdp_hparams hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_batch b = {.input_ids = ids, .labels = labels, .n_micro = N_MICRO, .micro_batch = MICRO, .T = T};
    fsdp_step_result res;
    return fsdp_train_step(f, &b, &hp, &res, err);
}

/* One rank of pc: fsdp's peak and the plan's total. */
static void run_rank(const plan_case *pc, int rank, comm *c, rank_report *r) {
    errbuf err = {{0}};
    llama_config cfg = config_of(pc);
    memory_plan_options o = options_of(pc, &cfg, rank);
    fsdp_options fo = {.sharding = pc->sharding, .recompute = recomputes[pc->ckpt],
                       .forward_prefetch = 1, .backward_prefetch = 1,
                       .lora = o.lora, .seed = 42, .quant = o.quant,
                       .cpu_offload = pc->cpu_offload, .offload_params = pc->offload_params,
                       .offload_threads = 2, .pref = {.objective = pc->objective, .beta = 0.1},
                       .offload_layers = pc->offload_layers, .mlp_chunk = pc->mlp_chunk,
                       .fp8 = pc->fp8 != 0, .fp8_scaling = K_FP8_TENSORWISE, .fp8_grad_format = FP8_E4M3,
                       .fp8_all_gather = pc->fp8 == 2, .compute_copies = pc->copies};
    memory_plan p;
    kctx ctx;
    fsdp f;
    void *image = NULL;
    memset(&f, 0, sizeof f);
    int rc = memory_plan_compute(&o, &p, &err);
    if (rc == 0 && (rc = kctx_init(&ctx, K_CPU, 0, &err)) == 0 && (rc = k_cpu_defer_copies(&ctx, &err)) == 0) {
        rc = fsdp_init(&f, &cfg, &ctx, c, rank, pc->world, &fo, &err);
        if (rc == 0) rc = train_one_step(&f, pc, rank, &image, &err);
        r->peak = k_peak_bytes(&ctx);
        fsdp_destroy(&f);
        kctx_destroy(&ctx);
        free(image);
    }
    r->ok = rc == 0;
    r->planned = p.total;
    snprintf(r->msg, sizeof r->msg, "%s", err.msg);
}

/* Forks one child per rank, each reporting through a pipe; a child that hangs dies of
 * SIGALRM and reports nothing. */
static void run_ranks(const plan_case *pc, rank_report *rep) {
    comm_listener lis[2];
    const char *addr[2];
    errbuf err = {{0}};
    for (int r = 0; r < pc->world; r++) {
        if (comm_tcp_listen(&lis[r], "127.0.0.1", &err)) fail_msg("%s", err.msg);
        addr[r] = lis[r].addr;
    }
    comm_rank_table table = {.world = pc->world, .addr = addr};
    comm_options copt = {.timeout_s = 30, .init_timeout_s = 30};
    int fd[2];
    pid_t pid[2];
    fflush(stdout);
    for (int r = 0; r < pc->world; r++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            signal(SIGABRT, SIG_DFL);
            signal(SIGSEGV, SIG_DFL);
            alarm(120);
            close(p[0]);
            for (int k = 0; k < pc->world; k++)
                if (k != r) comm_listener_close(&lis[k]);
            rank_report mine = {0};
            comm *c = NULL;
            if (comm_init(&c, &copt, r, &table, &lis[r], &err)) snprintf(mine.msg, sizeof mine.msg, "%s", err.msg);
            else run_rank(pc, r, c, &mine);
            comm_destroy(c);
            ssize_t n = write(p[1], &mine, sizeof mine);
            exit(n == (ssize_t)sizeof mine ? 0 : 3);
        }
        close(p[1]);
        fd[r] = p[0];
    }
    for (int r = 0; r < pc->world; r++) comm_listener_close(&lis[r]);
    for (int r = 0; r < pc->world; r++) {
        ssize_t n;
        while ((n = read(fd[r], &rep[r], sizeof rep[r])) < 0 && errno == EINTR) {
        }
        if (n != (ssize_t)sizeof rep[r]) snprintf(rep[r].msg, sizeof rep[r].msg, "rank %d sent no report", r);
        close(fd[r]);
        int status;
        while (waitpid(pid[r], &status, 0) < 0 && errno == EINTR) {
        }
    }
}

static void check_case(const plan_case *pc) {
    rank_report rep[2];
    memset(rep, 0, sizeof rep);
    if (pc->world == 1) run_rank(pc, 0, NULL, &rep[0]);
    else run_ranks(pc, rep);
    for (int r = 0; r < pc->world; r++) {
        const char *what = kind_names[pc->kind];
        if (!rep[r].ok)
            fail_msg("%s, world %d, checkpointing %d, rank %d: %s", what, pc->world, pc->ckpt, r, rep[r].msg);
        printf("%-32s world %d%s ckpt %d tied %d offload %d/%d/%d rank %d: plan %zu, fsdp's peak %zu\n",
               what, pc->world, pc->sharding == JOB_SHARD_NONE ? " no_shard" : pc->sharding == JOB_SHARD_GRAD_OP ? " grad_op" : "", pc->ckpt, pc->tied,
               pc->cpu_offload, pc->offload_params, pc->offload_layers, r, rep[r].planned, rep[r].peak);
        if (rep[r].planned != rep[r].peak)
            fail_msg("%s, world %d, checkpointing %d, tied %d, rank %d: the plan says %zu bytes, fsdp "
                     "allocated at most %zu", what, pc->world, pc->ckpt, pc->tied, r, rep[r].planned,
                     rep[r].peak);
    }
}

/* Every kind x world 1, 2 x every kind of checkpointing. */
static void test_plan_equals_fsdp_peak(void **state) {
    (void)state;
    for (int k = FULL; k <= QLORA; k++)
        for (int world = 1; world <= 2; world++)
            for (int ckpt = 0; ckpt < N_RECOMPUTES; ckpt++)
                check_case(&(plan_case){.kind = (kind)k, .world = world, .ckpt = ckpt, .sharding = JOB_SHARD_FULL});
}

/* The slots a tied head adds, NF4 without double quantization, and no_shard (every rank
 * whole, gradients all-reduced). */
static void test_plan_equals_fsdp_peak_variants(void **state) {
    (void)state;
    for (int world = 1; world <= 2; world++) {
        check_case(&(plan_case){.kind = FULL, .world = world, .tied = 1, .sharding = JOB_SHARD_FULL});
        check_case(&(plan_case){.kind = LORA, .world = world, .tied = 1, .sharding = JOB_SHARD_FULL});
        check_case(&(plan_case){.kind = QLORA_SINGLE, .world = world, .sharding = JOB_SHARD_FULL});
    }
    check_case(&(plan_case){.kind = FULL, .world = 2, .sharding = JOB_SHARD_NONE});
    check_case(&(plan_case){.kind = LORA, .world = 2, .sharding = JOB_SHARD_NONE});
    /* hybrid_shard on one node: the node is the shard group */
    check_case(&(plan_case){.kind = FULL, .world = 2, .sharding = JOB_SHARD_HYBRID});
}

/* The families' extra tensors and activations (Qwen3's pre-norm q and k and their rstd) are
 * planned exactly: every kind, world 1 and 2, with and without recomputation. */
static void test_plan_equals_fsdp_peak_families(void **state) {
    (void)state;
    for (int fam = FAMILY_QWEN2; fam <= FAMILY_MISTRAL; fam++)
        for (int k = FULL; k <= QLORA; k++)
            for (int world = 1; world <= 2; world++)
                for (int ckpt = 0; ckpt <= 2; ckpt += 2)
                    check_case(&(plan_case){.kind = (kind)k, .world = world, .ckpt = ckpt, .tied = fam == FAMILY_QWEN3,
                                            .sharding = JOB_SHARD_FULL, .family = (llama_family)fam});
}

/* shard_grad_op: a kept slot for the embedding, each layer and the head (tied or not, with
 * or without checkpointing, which recomputes from the kept copies). */
static void test_plan_equals_fsdp_peak_grad_op(void **state) {
    (void)state;
    for (int world = 1; world <= 2; world++)
        for (int tied = 0; tied <= 1; tied++)
            for (int ckpt = 0; ckpt <= 1; ckpt++)
                check_case(&(plan_case){.kind = FULL, .world = world, .tied = tied, .ckpt = ckpt,
                                        .sharding = JOB_SHARD_GRAD_OP});
}

/* Offload: cpu_offload (every kind), offload_params (adapters; a full fine-tune with
 * cpu_offload), both, at world 1 and 2. */
static void test_plan_equals_fsdp_peak_offloaded(void **state) {
    (void)state;
    for (int k = FULL; k <= QLORA; k++)
        for (int world = 1; world <= 2; world++)
            for (int mode = 1; mode <= 3; mode++) {
                plan_case pc = {.kind = (kind)k, .world = world, .sharding = JOB_SHARD_FULL,
                                .cpu_offload = mode & 1, .offload_params = mode >> 1};
                if (k == FULL && mode == 2) continue; /* refused: nothing frozen to stream */
                check_case(&pc);
            }
}

/* fsdp.offload_activations: the first layer's input on the host, every kind, world 1 and 2,
 * alone and with cpu_offload (the host's copies are not context memory). */
static void test_plan_equals_fsdp_peak_offload_activations(void **state) {
    (void)state;
    for (int k = FULL; k <= QLORA; k++)
        for (int world = 1; world <= 2; world++)
            for (int cpu = 0; cpu <= 1; cpu++)
                check_case(&(plan_case){.kind = (kind)k, .world = world, .ckpt = 1, .sharding = JOB_SHARD_FULL,
                                        .cpu_offload = cpu, .offload_layers = 1});
}

/* Preference objectives: the span sums and gathered figures; DPO with a full fine-tune its
 * reference, a frozen copy of the model's shards loaded through the staging buffer (tied or
 * not, full_shard, no_shard, shard_grad_op, offloaded: offload_params streams it), at world
 * 1 and 2. */
static void test_plan_equals_fsdp_peak_pref(void **state) {
    (void)state;
    for (int world = 1; world <= 2; world++) {
        for (int k = FULL; k <= LORA; k++)
            for (int obj = JOB_OBJECTIVE_DPO; obj <= JOB_OBJECTIVE_ORPO; obj++)
                check_case(&(plan_case){.kind = (kind)k, .world = world, .sharding = JOB_SHARD_FULL,
                                        .objective = (job_objective)obj});
        check_case(&(plan_case){.kind = FULL, .world = world, .tied = 1, .ckpt = 1, .sharding = JOB_SHARD_FULL,
                                .objective = JOB_OBJECTIVE_DPO});
        check_case(&(plan_case){.kind = FULL, .world = world, .sharding = JOB_SHARD_GRAD_OP,
                                .objective = JOB_OBJECTIVE_DPO});
    }
    check_case(&(plan_case){.kind = FULL, .world = 2, .sharding = JOB_SHARD_NONE, .objective = JOB_OBJECTIVE_DPO});
    for (int world = 1; world <= 2; world++) /* offloaded; offload_params streams the reference */
        for (int params = 0; params <= 1; params++)
            check_case(&(plan_case){.kind = FULL, .world = world, .sharding = JOB_SHARD_FULL, .cpu_offload = 1,
                                    .offload_params = params, .objective = JOB_OBJECTIVE_DPO});
}

static memory_plan plan_of(const memory_plan_options *o) {
    memory_plan p;
    errbuf err = {{0}};
    if (memory_plan_compute(o, &p, &err)) fail_msg("%s", err.msg);
    return p;
}

/* Categories computed by hand for the small model (27545 parameters: embedding 61 x 35 =
 * 2135; each layer q 40 x 35, k and v 20 x 35, o 35 x 40, gate, up and down 70 x 35, two
 * norms of 35 = 11620; the head 35 + 2135). */
static void test_hand_computed(void **state) {
    (void)state;
    llama_config cfg = small_config(0);
    plan_case pc = {.kind = FULL, .world = 1, .sharding = JOB_SHARD_FULL};
    memory_plan_options o = options_of(&pc, &cfg, 0);
    /* one rank: 4 fp32 copies (master, m, v, grad) of every parameter */
    assert_int_equal(plan_of(&o).trainable, 27545 * 4 * 4);
    assert_int_equal(plan_of(&o).frozen, 0);
    assert_int_equal(plan_of(&o).load_staging, 0);
    /* two ranks: units of 2135 (padded to 2136), 11620, 11620 and 2170 elements, halved */
    o.world = 2;
    o.rank = 1;
    assert_int_equal(plan_of(&o).trainable, (1068 + 5810 + 5810 + 1085) * 4 * 4);
    /* gather slots 0 and 1 of the largest unit in fp32, its gradient slots too */
    assert_int_equal(plan_of(&o).gather_slots, 2 * 11620 * 4);
    assert_int_equal(plan_of(&o).grad_slots, 2 * 11620 * 4);
    /* shard_grad_op keeps 4 gathered units (the embedding, 2 layers, the head), each slot of
     * the largest; the gradient slots stay */
    o.sharding = JOB_SHARD_GRAD_OP;
    assert_int_equal(plan_of(&o).gather_slots, 4 * 11620 * 4);
    assert_int_equal(plan_of(&o).grad_slots, 2 * 11620 * 4);
    o.sharding = JOB_SHARD_FULL;
    /* hybrid_shard over 2 nodes of 2: sharded over the node's 2, as full_shard over 2 */
    memory_plan_options h = o;
    h.sharding = JOB_SHARD_HYBRID;
    h.world = 4;
    h.group = 2;
    assert_int_equal(plan_of(&h).trainable, plan_of(&o).trainable);
    assert_int_equal(plan_of(&h).gather_slots, plan_of(&o).gather_slots);
    /* RoPE's 5 frequencies, 2 scalars, 2 ranks' statistics of 72 bytes (3 figures, 6 votes) */
    assert_int_equal(plan_of(&o).small, 5 * 4 + 2 * 4 + 2 * 72);
    /* cpu_offload, one rank: the grads and the compute copies stay; master, m, v, the grads'
     * copy and the compute copies are pinned host memory; offload_params leaves the copies */
    o.world = 1;
    o.rank = 0;
    o.cpu_offload = 1;
    assert_int_equal(plan_of(&o).trainable, 27545 * (4 + 4));
    assert_int_equal(plan_of(&o).host_offload, 27545 * (4 * 4 + 4));
    o.offload_params = 1;
    assert_int_equal(plan_of(&o).trainable, 27545 * 4);
    o.cpu_offload = o.offload_params = 0;
    assert_int_equal(plan_of(&o).host_offload, 0);
    /* DPO with a full fine-tune: the reference's shards beside the same trainable ones (fp32
     * here, each at a 256-byte boundary: 8540 -> 8704, 46480 -> 46592, 8680 -> 8704), loaded
     * through the staging buffer; the span sums (2 rows of MICRO) from the first step */
    memory_plan sft = plan_of(&o);
    o.objective = JOB_OBJECTIVE_DPO;
    assert_int_equal(plan_of(&o).trainable, sft.trainable);
    assert_int_equal(plan_of(&o).frozen, 8704 + 2 * 46592 + 8704);
    assert_int_equal(plan_of(&o).load_staging, (16u << 20) * 4);
    assert_int_equal(plan_of(&o).small, sft.small + 2 * MICRO * 4);
    o.objective = JOB_OBJECTIVE_ORPO; /* no reference */
    assert_int_equal(plan_of(&o).frozen, 0);
    o.objective = JOB_OBJECTIVE_SFT;

    /* LoRA rank 3 on every linear: per layer A [3, in] + B [out, 3] of q (35 -> 40), k, v
     * (35 -> 20), o (40 -> 35), gate, up (35 -> 70), down (70 -> 35) = 1725 elements */
    o.lora = &small_lora;
    o.world = 1;
    o.rank = 0;
    memory_plan p = plan_of(&o);
    assert_int_equal(p.trainable, 2 * 1725 * 4 * 4);
    /* the frozen units in fp32, each at a 256-byte boundary: 8540 -> 8704, 46480 -> 46592 */
    assert_int_equal(p.frozen, 8704 + 2 * 46592 + 8704);
    assert_int_equal(p.load_staging, (16u << 20) * 4);
    o.world = 2;
    assert_int_equal(plan_of(&o).trainable, 2 * 863 * 4 * 4); /* 1725 -> 1726, halved */

    /* activations grow with the micro-batch; checkpointing keeps one layer's internals */
    o.world = 1;
    memory_plan base = plan_of(&o);
    o.micro_batch = 2 * MICRO;
    assert_true(plan_of(&o).activations > base.activations);
    o.micro_batch = MICRO;
    o.recompute = recomputes[1];
    assert_true(plan_of(&o).activations < base.activations);
    assert_int_equal(plan_of(&o).total, base.total); /* the staging buffer is the peak */
    o.lora = NULL;
    o.recompute = recomputes[0];
    base = plan_of(&o);
    o.recompute = recomputes[1];
    assert_true(plan_of(&o).total < base.total);
}

/* auto: no bound keeps everything; a budget of selective's plan gets selective (it
 * recomputes less than full), one byte less full; nothing fitting is full too.  The
 * recomputed FLOPs: the first layer's MLP (gate, up) and, for full, its attention. */
/* fsdp.mlp_chunk: the MLP's buffers of 5 rows of 24 (the last chunk 4), full and selective
 * recompute, every kind, world 1 and 2, with offloaded inputs. */
static void test_plan_equals_fsdp_peak_mlp_chunk(void **state) {
    (void)state;
    for (int k = FULL; k <= QLORA; k++)
        for (int world = 1; world <= 2; world++)
            for (int ckpt = 1; ckpt <= 2; ckpt++)
                check_case(&(plan_case){.kind = (kind)k, .world = world, .ckpt = ckpt, .sharding = JOB_SHARD_FULL,
                                        .mlp_chunk = 5, .offload_layers = ckpt == 1});
}

/* train.precision fp8: the FP8 projections' operand, scale and product buffers, under every
 * checkpointing of the list, world 1 and 2, without and with FP8 gathers (their amaxes and
 * scales); the gathers under shard_grad_op and no_shard too. */
static void test_plan_equals_fsdp_peak_fp8(void **state) {
    (void)state;
    for (int fp8 = 1; fp8 <= 2; fp8++)
        for (int world = 1; world <= 2; world++)
            for (int ckpt = 0; ckpt < N_RECOMPUTES; ckpt++)
                check_case(&(plan_case){.kind = FULL, .world = world, .ckpt = ckpt, .sharding = JOB_SHARD_FULL, .fp8 = fp8});
    check_case(&(plan_case){.kind = FULL, .world = 2, .ckpt = 1, .sharding = JOB_SHARD_GRAD_OP, .fp8 = 2});
    check_case(&(plan_case){.kind = FULL, .world = 2, .ckpt = 1, .sharding = JOB_SHARD_NONE, .fp8 = 2});
}

/* Compute copies (what is trained whole on each rank): the copies in, the trained units'
 * gather slots out, under every checkpointing, tied or not, no_shard on two ranks, FP8
 * linears (their weights cast at each GEMM from the copies), a full DPO, and adapters (LoRA,
 * QLoRA, the base streamed or not). */
static void test_plan_equals_fsdp_peak_compute_copies(void **state) {
    (void)state;
    for (int ckpt = 0; ckpt < N_RECOMPUTES; ckpt++)
        for (int tied = 0; tied <= 1; tied++)
            check_case(&(plan_case){.kind = FULL, .world = 1, .ckpt = ckpt, .tied = tied, .sharding = JOB_SHARD_FULL,
                                    .copies = 1});
    check_case(&(plan_case){.kind = FULL, .world = 2, .ckpt = 1, .sharding = JOB_SHARD_NONE, .copies = 1});
    check_case(&(plan_case){.kind = FULL, .world = 1, .ckpt = 1, .sharding = JOB_SHARD_FULL, .fp8 = 1, .copies = 1});
    check_case(&(plan_case){.kind = FULL, .world = 1, .sharding = JOB_SHARD_FULL, .objective = JOB_OBJECTIVE_DPO,
                            .copies = 1});
    /* adapters: their copies in, their slots out (the base as before) */
    for (int k = LORA; k <= QLORA; k++)
        for (int ckpt = 0; ckpt <= 1; ckpt++) {
            check_case(&(plan_case){.kind = (kind)k, .world = 1, .ckpt = ckpt, .sharding = JOB_SHARD_FULL, .copies = 1});
            check_case(&(plan_case){.kind = (kind)k, .world = 1, .ckpt = ckpt, .sharding = JOB_SHARD_FULL,
                                    .offload_params = 1, .copies = 1});
        }
    check_case(&(plan_case){.kind = LORA, .world = 2, .ckpt = 1, .sharding = JOB_SHARD_NONE, .copies = 1});
}

/* memory_plan_offload_layers: none when everything fits, else the fewest layer inputs that
 * make it fit (one input's bytes each), all but the last layer's when nothing fits; its host
 * bytes counted. */
static void test_offload_layers(void **state) {
    (void)state;
    llama_config cfg = small_config(0);
    cfg.num_hidden_layers = 6;
    memory_plan_options o = options_of(&(plan_case){.kind = FULL, .world = 1, .ckpt = 1, .sharding = JOB_SHARD_FULL},
                                       &cfg, 0); /* no staging buffer: the step is the peak */
    o.recompute = (llama_recompute){6, LLAMA_KEEP_INPUT};
    size_t full = plan_of(&o).total, input = ((size_t)MICRO * T * 35 * sizeof(float) + 255) / 256 * 256;
    assert_int_equal(memory_plan_offload_layers(&o, SIZE_MAX), 0);
    assert_int_equal(memory_plan_offload_layers(&o, full), 0);
    assert_int_equal(memory_plan_offload_layers(&o, full - 1), 1);
    assert_int_equal(memory_plan_offload_layers(&o, full - input), 1);
    assert_int_equal(memory_plan_offload_layers(&o, full - 3 * input - 1), 4);
    assert_int_equal(memory_plan_offload_layers(&o, 1), 5);
    o.offload_layers = 4;
    memory_plan p = plan_of(&o);
    assert_int_equal(p.total, full - 4 * input);
    assert_int_equal(p.host_activations, 4 * input);
    /* refused: more than L - 1, or without full recompute */
    errbuf err = {{0}};
    o.offload_layers = 6;
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    assert_non_null(strstr(err.msg, "6 of 6 layer inputs offloaded (0 .. 5, with full recompute)"));
    o.offload_layers = 1;
    o.recompute = recomputes[2];
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    /* fsdp.mlp_chunk: refused without the MLP recomputed, or with adapters' dropout */
    o.offload_layers = 0;
    o.mlp_chunk = 4;
    o.recompute = (llama_recompute){0, LLAMA_KEEP_ALL};
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    assert_non_null(strstr(err.msg, "memory plan: mlp_chunk 4 needs every layer's MLP recomputed and no adapter dropout"));
    o.recompute = (llama_recompute){6, LLAMA_KEEP_ATTENTION};
    assert_int_equal(memory_plan_compute(&o, &p, &err), 0);
    o.lora = &small_lora; /* dropout 0.1 */
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
}

static void test_auto_recompute(void **state) {
    (void)state;
    llama_config cfg = small_config(0);
    memory_plan_options o = options_of(&(plan_case){.kind = FULL, .world = 1, .sharding = JOB_SHARD_FULL}, &cfg, 0);
    llama_recompute r = memory_plan_auto_recompute(&o, SIZE_MAX);
    assert_int_equal(r.layers, 0);
    o.recompute = recomputes[2];
    size_t selective = plan_of(&o).total;
    o.recompute = recomputes[1];
    size_t full = plan_of(&o).total;
    assert_true(full < selective);
    r = memory_plan_auto_recompute(&o, selective);
    assert_int_equal(r.layers, 2);
    assert_int_equal(r.keep, LLAMA_KEEP_ATTENTION);
    o.recompute = recomputes[5];
    size_t residual = plan_of(&o).total;
    o.recompute = recomputes[7];
    size_t context = plan_of(&o).total;
    assert_true(full < residual && residual < context && context < selective);
    r = memory_plan_auto_recompute(&o, selective - 1);
    assert_int_equal(r.keep, LLAMA_KEEP_CONTEXT);
    assert_int_equal(r.layers, 2);
    r = memory_plan_auto_recompute(&o, context - 1);
    assert_int_equal(r.keep, LLAMA_KEEP_RESIDUAL);
    assert_int_equal(r.layers, 2);
    r = memory_plan_auto_recompute(&o, residual - 1);
    assert_int_equal(r.keep, LLAMA_KEEP_INPUT);
    assert_int_equal(r.layers, 2);
    r = memory_plan_auto_recompute(&o, full / 2);
    assert_int_equal(r.keep, LLAMA_KEEP_INPUT);
    assert_int_equal(r.layers, 2);
    double N = MICRO * T, mlp = 2 * N * 2 * 35 * 70;
    double o_proj = 2 * N * 40 * 35, core = 2.0 * MICRO * 4 * T * T * 10;
    double attention = 2 * N * (35 * 40 + 2 * 35 * 20) + o_proj + core;
    assert_true(memory_plan_recompute_flops(&o, recomputes[2]) == mlp);
    assert_true(memory_plan_recompute_flops(&o, recomputes[1]) == mlp + attention);
    assert_true(memory_plan_recompute_flops(&o, recomputes[5]) == mlp + attention - o_proj);
    assert_true(memory_plan_recompute_flops(&o, recomputes[7]) == mlp + attention - o_proj - core);
    assert_true(memory_plan_recompute_flops(&o, recomputes[0]) == 0);
}

static void test_bad_options(void **state) {
    (void)state;
    llama_config cfg = small_config(0);
    plan_case pc = {.kind = FULL, .world = 2, .sharding = JOB_SHARD_FULL};
    memory_plan_options o = options_of(&pc, &cfg, 2);
    memory_plan p;
    errbuf err = {{0}};
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    assert_non_null(strstr(err.msg, "rank 2 of world 2"));
    o = options_of(&pc, &cfg, 0);
    o.sharding = (job_sharding)7;
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    assert_non_null(strstr(err.msg, "sharding 7 is not one fsdp builds"));
    o.sharding = JOB_SHARD_HYBRID;
    o.group = 0;
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    assert_non_null(strstr(err.msg, "hybrid_shard's group of 0 ranks"));
    o = options_of(&pc, &cfg, 0);
    o.sharding = JOB_SHARD_GRAD_OP;
    o.lora = &small_lora;
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    assert_non_null(strstr(err.msg, "shard_grad_op with adapters"));
    o = options_of(&pc, &cfg, 0);
    o.micro_batch = 0;
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    o = options_of(&pc, &cfg, 0);
    lora_config bad = small_lora;
    bad.rank = 0;
    o.lora = &bad;
    assert_int_equal(memory_plan_compute(&o, &p, &err), -1);
    assert_non_null(strstr(err.msg, "rank"));
}

static void test_format(void **state) {
    (void)state;
    memory_plan p = {.trainable = 3ull << 30, .frozen = 0, .gather_slots = 1ull << 29,
                     .grad_slots = 1ull << 30, .activations = 5ull << 30, .small = 100,
                     .load_staging = 64ull << 20, .total = (19ull << 29) + 100};
    char out[400];
    memory_plan_format(&p, out, sizeof out);
    assert_string_equal(out, "9.5 GiB (10200547428 bytes): trainable shards 3.0 GiB, frozen shards "
                             "0.0 GiB, gather slots 0.5 GiB, gradient slots 1.0 GiB, activations "
                             "5.0 GiB, small buffers 0.0 GiB, loading the base 0.1 GiB");
    memory_plan_format(&p, out, 10); /* truncated, terminated */
    assert_string_equal(out, "9.5 GiB (");
}

/* A model whose full fine-tune needs more than an adapter job's 64 MiB staging buffer: 42M
 * parameters. */
static llama_config medium_config(void) {
    llama_config c = small_config(0);
    c.hidden_size = 1024;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 16;
    c.head_dim = 64;
    c.vocab_size = 1000;
    return c;
}

/* A job on 2 ranks: micro-batch 6 of 6 rows per rank, no checkpointing. */
static job_config small_job(int64_t limit) {
    job_config j;
    job_defaults(&j);
    j.train.global_batch = 12;
    j.train.micro_batch = 6;
    j.data.seq_len = 48;
    j.lora.rank = 3;
    j.runtime.gpu_memory_limit = limit;
    errbuf err = {{0}};
    if (job_resolve(&j, 2, &err)) fail_msg("%s", err.msg); /* lora.config from lora.* */
    return j;
}

static size_t job_total(const job_config *j, const llama_config *cfg, int world, model_image_quant q) {
    memory_plan_options o;
    memory_plan_job_options(j, cfg, world, 0, q, 4, SIZE_MAX, &o);
    return plan_of(&o).total;
}

static void check_refused(const job_config *j, const llama_config *cfg, const char *part) {
    errbuf err = {{0}};
    if (memory_plan_check_job(j, cfg, 2, 0, MODEL_IMAGE_PLAIN, 4, &err) != -1)
        fail_msg("a limit of %lld bytes was not refused (expecting \"%s\")",
                 (long long)j->runtime.gpu_memory_limit, part);
    if (!strstr(err.msg, part)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, part);
    assert_non_null(strstr(err.msg, "runtime.gpu_memory_limit: each worker needs"));
    assert_true(strlen(err.msg) < sizeof err.msg - 1); /* nothing cut off */
}

/* memory_plan_job_options takes compute copies where fsdp builds them and the plan with them
 * fits the budget (after auto's activations), and fsdp refuses them elsewhere. */
static void test_compute_copies_decided(void **state) {
    (void)state;
    llama_config cfg = medium_config();
    job_config j = small_job(0);
    memory_plan_options o;
    memory_plan_job_options(&j, &cfg, 1, 0, MODEL_IMAGE_PLAIN, 2, SIZE_MAX, &o);
    assert_int_equal(o.compute_copies, 1);
    memory_plan copies = plan_of(&o);
    size_t with = copies.total;
    o.compute_copies = 0;
    memory_plan without = plan_of(&o);
    /* the copies (2 bytes an element) in, the gather slots out */
    assert_true(without.gather_slots > 0);
    assert_int_equal(copies.gather_slots, 0);
    assert_int_equal(copies.trainable - without.trainable, 2 * without.trainable_elems);
    assert_int_equal(with - without.total, 2 * without.trainable_elems - without.gather_slots);
    memory_plan_job_options(&j, &cfg, 1, 0, MODEL_IMAGE_PLAIN, 2, with, &o);
    assert_int_equal(o.compute_copies, 1);
    memory_plan_job_options(&j, &cfg, 1, 0, MODEL_IMAGE_PLAIN, 2, with - 1, &o);
    assert_int_equal(o.compute_copies, 0);
    /* auto keeps activations first: at the budget of everything kept without copies, no copies */
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_AUTO;
    memory_plan_job_options(&j, &cfg, 1, 0, MODEL_IMAGE_PLAIN, 2, without.total, &o);
    assert_int_equal(o.recompute.layers, 0);
    assert_int_equal(o.compute_copies, 0);
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_NONE;
    /* none where fsdp does not build them */
    memory_plan_job_options(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 2, SIZE_MAX, &o); /* full_shard on 2 */
    assert_int_equal(o.compute_copies, 0);
    j.fsdp.sharding = JOB_SHARD_NONE;
    memory_plan_job_options(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 2, SIZE_MAX, &o);
    assert_int_equal(o.compute_copies, 1);
    j.fsdp.sharding = JOB_SHARD_FULL;
    j.fsdp.cpu_offload = true;
    memory_plan_job_options(&j, &cfg, 1, 0, MODEL_IMAGE_PLAIN, 2, SIZE_MAX, &o);
    assert_int_equal(o.compute_copies, 0);
    j.fsdp.cpu_offload = false;
    j.train.type = JOB_TRAIN_LORA; /* the adapters' copies */
    memory_plan_job_options(&j, &cfg, 1, 0, MODEL_IMAGE_PLAIN, 2, SIZE_MAX, &o);
    assert_int_equal(o.compute_copies, 1);
    /* fsdp_init's refusals */
    kctx ctx;
    errbuf err = {{0}};
    fsdp f;
    if (kctx_init(&ctx, K_CPU, 0, &err)) fail_msg("%s", err.msg);
    fsdp_options fo = {.sharding = JOB_SHARD_FULL, .recompute = recomputes[0], .compute_copies = 1, .cpu_offload = 1};
    assert_int_equal(fsdp_init(&f, &cfg, &ctx, NULL, 0, 1, &fo, &err), -1);
    assert_non_null(strstr(err.msg, "compute copies with shard_grad_op, cpu_offload or FP8 gathers are not built"));
    fo.cpu_offload = 0;
    fo.sharding = JOB_SHARD_GRAD_OP;
    assert_int_equal(fsdp_init(&f, &cfg, &ctx, NULL, 0, 1, &fo, &err), -1);
    kctx_destroy(&ctx);
}

/* memory_plan_check_job: a job that fits passes, one byte less fails naming what it needs and
 * the limit; each suggestion is the plan of that change alone, and is made exactly when it
 * fits. */
static void test_check_job(void **state) {
    (void)state;
    llama_config cfg = medium_config();
    errbuf err = {{0}};
    job_config j = small_job(0);
    assert_int_equal(memory_plan_check_job(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 4, &err), 0); /* no limit */
    size_t need = job_total(&j, &cfg, 2, MODEL_IMAGE_PLAIN);
    j.runtime.gpu_memory_limit = (int64_t)need;
    assert_int_equal(memory_plan_check_job(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 4, &err), 0);
    j.runtime.gpu_memory_limit = (int64_t)need - 1;
    char part[160];
    snprintf(part, sizeof part, "(%zu bytes): trainable shards", need);
    check_refused(&j, &cfg, part);
    snprintf(part, sizeof part, "the limit is 0.6 GiB (%zu bytes). Each of these alone would fit: ", need - 1);
    check_refused(&j, &cfg, part);

    /* each alternative, at its own plan's total as the limit */
    job_config alt = j;
    alt.fsdp.activation_checkpointing = JOB_ACT_CKPT_FULL;
    j.runtime.gpu_memory_limit = (int64_t)job_total(&alt, &cfg, 2, MODEL_IMAGE_PLAIN);
    check_refused(&j, &cfg, "fsdp.activation_checkpointing=full (");
    alt = j;
    alt.train.micro_batch = 4; /* fits, but 4 does not divide the 6 rows: 3 is suggested */
    j.runtime.gpu_memory_limit = (int64_t)job_total(&alt, &cfg, 2, MODEL_IMAGE_PLAIN);
    check_refused(&j, &cfg, "train.micro_batch=3 (");
    assert_int_equal(memory_plan_check_job(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 4, &err), -1);
    assert_null(strstr(err.msg, "train.micro_batch=4"));
    alt = j;
    alt.train.type = JOB_TRAIN_LORA;
    j.runtime.gpu_memory_limit = (int64_t)job_total(&alt, &cfg, 2, MODEL_IMAGE_PLAIN);
    check_refused(&j, &cfg, "train.type=lora (");
    check_refused(&j, &cfg, "train.type=qlora ("); /* qlora needs less than lora */
    alt.train.type = JOB_TRAIN_QLORA;
    j.runtime.gpu_memory_limit = (int64_t)job_total(&alt, &cfg, 2, MODEL_IMAGE_NF4_DQ);
    assert_int_equal(memory_plan_check_job(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 4, &err), -1);
    assert_null(strstr(err.msg, "train.type=lora ("));
    assert_non_null(strstr(err.msg, "train.type=qlora ("));

    /* more workers: the fewest that fit */
    size_t w5 = job_total(&j, &cfg, 5, MODEL_IMAGE_PLAIN), w4 = job_total(&j, &cfg, 4, MODEL_IMAGE_PLAIN);
    assert_true(w5 < w4);
    j.runtime.gpu_memory_limit = (int64_t)w5;
    check_refused(&j, &cfg, ": 5 workers (0.4 GiB)");

    /* offload: cpu_offload alone (a full fine-tune has nothing frozen to stream) */
    alt = j;
    alt.fsdp.cpu_offload = true;
    j.runtime.gpu_memory_limit = (int64_t)job_total(&alt, &cfg, 2, MODEL_IMAGE_PLAIN);
    check_refused(&j, &cfg, "fsdp.cpu_offload=true (");
    assert_int_equal(memory_plan_check_job(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 4, &err), -1);
    assert_null(strstr(err.msg, ": fsdp.offload_params=true (")); /* refused alone in a full fine-tune */
    assert_null(strstr(err.msg, "; fsdp.offload_params=true ("));
    alt.fsdp.offload_params = true; /* less again: the compute copies streamed from the host */
    j.runtime.gpu_memory_limit = (int64_t)job_total(&alt, &cfg, 2, MODEL_IMAGE_PLAIN);
    check_refused(&j, &cfg, "fsdp.cpu_offload=true with fsdp.offload_params=true (");
    assert_int_equal(memory_plan_check_job(&j, &cfg, 2, 0, MODEL_IMAGE_PLAIN, 4, &err), -1);
    assert_null(strstr(err.msg, "fsdp.cpu_offload=true ("));

    /* a limit nothing fits */
    j.runtime.gpu_memory_limit = 1000;
    check_refused(&j, &cfg, "No single change of fsdp.activation_checkpointing, train.micro_batch, "
                            "the number of workers, train.type or offload fits it");
}

/* A Llama 3 8B full fine-tune on 8 GPUs of 24 GiB, in bf16: the message fits in an errbuf. */
static void test_message_of_a_large_job(void **state) {
    (void)state;
    llama_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.hidden_size = 4096;
    cfg.intermediate_size = 14336;
    cfg.num_hidden_layers = 32;
    cfg.num_attention_heads = 32;
    cfg.num_key_value_heads = 8;
    cfg.head_dim = 128;
    cfg.vocab_size = 128256;
    cfg.max_position_embeddings = 8192;
    cfg.rms_norm_eps = 1e-5;
    cfg.rope = (rope_config){.type = ROPE_DEFAULT, .theta = 500000.0};
    job_config j;
    job_defaults(&j);
    j.train.global_batch = 64;
    j.train.micro_batch = 2;
    j.data.seq_len = 2048;
    j.runtime.gpu_memory_limit = 24ll << 30;
    errbuf err = {{0}};
    assert_int_equal(memory_plan_check_job(&j, &cfg, 8, 3, MODEL_IMAGE_PLAIN, 2, &err), -1);
    printf("%s\n", err.msg);
    assert_true(strlen(err.msg) < sizeof err.msg - 1);
    assert_non_null(strstr(err.msg, "fsdp.activation_checkpointing=full ("));
    assert_non_null(strstr(err.msg, "workers ("));
    assert_non_null(strstr(err.msg, "train.type=lora ("));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_equals_fsdp_peak),
        cmocka_unit_test(test_plan_equals_fsdp_peak_variants),
        cmocka_unit_test(test_plan_equals_fsdp_peak_families),
        cmocka_unit_test(test_plan_equals_fsdp_peak_offloaded),
        cmocka_unit_test(test_plan_equals_fsdp_peak_offload_activations),
        cmocka_unit_test(test_offload_layers),
        cmocka_unit_test(test_plan_equals_fsdp_peak_mlp_chunk),
        cmocka_unit_test(test_plan_equals_fsdp_peak_fp8),
        cmocka_unit_test(test_plan_equals_fsdp_peak_pref),
        cmocka_unit_test(test_plan_equals_fsdp_peak_grad_op),
        cmocka_unit_test(test_plan_equals_fsdp_peak_compute_copies),
        cmocka_unit_test(test_compute_copies_decided),
        cmocka_unit_test(test_hand_computed),
        cmocka_unit_test(test_auto_recompute),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_check_job),
        cmocka_unit_test(test_message_of_a_large_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
