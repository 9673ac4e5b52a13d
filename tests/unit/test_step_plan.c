/* model/step_plan: step times, host RAM, the checkpoint and fsdpd's admission, against cases
 * computed by hand on a tiny model whose every GEMM takes 1 ms forward, 2 ms for the input
 * gradient and 3 ms for the weight gradient, and whose attention takes 5 ms forward and 7 ms
 * backward (memory-bound rates so high that they cost nothing). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "model/step_plan.h"
#include "proto/model_layout.h"

/* C 8, I 16, 2 layers, 2 heads of 4 (1 kv head), vocabulary 32; rows of 16 tokens. */
static llama_config tiny(void) {
    llama_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 8;
    c.intermediate_size = 16;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 4;
    c.vocab_size = 32;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.bos_token_id = c.eos_token_id = -1;
    c.rope = (rope_config){.type = ROPE_DEFAULT, .theta = 10000.0};
    return c;
}

/* Every GEMM of the tiny model at N = 16 (q and o share (8, 8)), LoRA r 2 on q, the head. */
static plan_gemm_rate gemms[] = {
    {16, 8, 8, 1, 2, 3},  {16, 8, 4, 1, 2, 3}, {16, 8, 16, 1, 2, 3}, {16, 16, 8, 1, 2, 3},
    {16, 8, 32, 1, 2, 3}, {16, 8, 2, 1, 2, 3}, {16, 2, 8, 1, 2, 3},
};
static plan_attention_rate attention[] = {{1, 16, 2, 1, 4, 5, 7}};

static plan_rates table(void) {
    plan_rates r = {.context_bytes = 1000, .elementwise_gbps = 1e12, .dequant_gbps = 1e12,
                    .cross_entropy_gbps = 1e12, .adamw_gbps = 1e12, .h2d_gbps = 1e12,
                    .d2h_gbps = 1e12, .registered_h2d_gbps = 1e12, .launch_us = 0, .host_adamw_gelems = 1e12, .disk_gbps = 2,
                    .gemm = gemms, .n_gemm = (int)(sizeof gemms / sizeof gemms[0]),
                    .attention = attention, .n_attention = 1};
    snprintf(r.gpu, sizeof r.gpu, "h200");
    return r;
}

static job_config job(int world) {
    job_config j;
    job_defaults(&j);
    j.train.global_batch = world;
    j.train.micro_batch = 1;
    j.data.seq_len = 16;
    j.model.dtype = JOB_DTYPE_BF16;
    j.lora.rank = 2;
    j.lora.alpha = 4;
    j.lora.dropout = 0;
    j.lora.n_targets = 1;
    snprintf(j.lora.targets[0], sizeof j.lora.targets[0], "q_proj");
    errbuf err = {{0}};
    j.runtime.backend = JOB_BACKEND_CUDA;
    j.runtime.workers_per_node = world;
    if (job_resolve(&j, world, &err)) fail_msg("%s", err.msg);
    return j;
}

static step_plan plan(const job_config *j, const char *gpu, int gpus, model_image_quant q,
                      const plan_rates *r) {
    llama_config c = tiny();
    plan_machine m = {.nodes = 1, .gpus_per_node = gpus, .gpu = plan_gpu_find(gpu), .net_gbps = 50};
    step_plan p;
    errbuf err = {{0}};
    if (step_plan_job(j, &c, q, &m, r, &p, &err)) fail_msg("%s", err.msg);
    return p;
}

static size_t least_total(const job_config *j);
static size_t total_with(const job_config *j, llama_recompute r);

static void near(double got, double want) {
    if (fabs(got - want) > 1e-9 + 1e-9 * fabs(want)) fail_msg("got %.12g, want %.12g", got, want);
}

/* A layer: 7 forward GEMMs + attention = 12 ms; backward 7 x (2 + 3) + 7 = 42 ms; the head's
 * one chunk 1 + 2 + 3 = 6 ms: 2 x (12 + 42) + 6 = 114 ms.  Full recompute adds the first
 * layer's forward but down_proj, 11 ms (the last layer's activations are still in place);
 * selective its gate and up, 2 ms; auto on an H200 keeps everything. */
static void test_full_fine_tune(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(1);
    step_plan p = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    near(p.step_s, 0.114);
    near(p.gemm_s, 0.114 - 2 * (0.005 + 0.007));
    near(p.attention_s, 2 * 0.012);
    assert_true(p.validated);
    near(p.tokens_per_s, 16 / 0.114);
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_FULL;
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).step_s, 0.125);
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).attention_s, 2 * 0.012 + 0.005);
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_SELECTIVE;
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).step_s, 0.116);
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_AUTO;
    step_plan a = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    near(a.step_s, 0.114);
    assert_int_equal(a.recompute.layers, 0);
    /* auto a byte short of selective: every layer keeps its input, h and the attention's
     * output, the first layer's q, k, v, gate and up recomputed, 5 ms; a byte short of that,
     * its input and h: its forward recomputed but down_proj and o_proj, 10 ms */
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_SELECTIVE;
    size_t selective = least_total(&j);
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_AUTO;
    j.runtime.gpu_memory_limit = (int64_t)selective - 1;
    a = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    assert_int_equal(a.recompute.layers, 2);
    assert_int_equal(a.recompute.keep, LLAMA_KEEP_CONTEXT);
    near(a.step_s, 0.119);
    j.runtime.gpu_memory_limit = (int64_t)total_with(&j, a.recompute) - 1;
    a = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    assert_int_equal(a.recompute.layers, 2);
    assert_int_equal(a.recompute.keep, LLAMA_KEEP_RESIDUAL);
    near(a.step_s, 0.124);
    j.runtime.gpu_memory_limit = 0;
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_FULL;
    /* two micro-batches: twice the compute */
    j.train.global_batch = 2;
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).step_s, 0.250);
}

/* LoRA on q (r 2): forward + A + B = 14 ms a layer; backward: 7 input gradients (14), B's and
 * A's both gradients (10) and attention (7) = 31 ms; the frozen head 1 + 2 = 3 ms:
 * 2 x (14 + 31) + 3 = 93 ms. */
static void test_lora(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(1);
    j.train.type = JOB_TRAIN_LORA;
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).step_s, 0.093);
}

/* Preference objectives: a micro-batch of 1 pair is 2 rows (every GEMM and attention at
 * twice the tokens: twice the times), so the SFT plan of 2 rows is 2 x 114 = 228 ms; the
 * policy's head adds its span sums' forward (2 ms); DPO the reference's forward, no backward:
 * 2 layers x 24 ms + the head's 2 ms = 50 ms (LoRA: the base's, the adapters off, the same).
 * Memory: the SFT plan of 2 rows', plus (full DPO) the frozen copy of the start weights. */
static void test_preference(void **state) {
    (void)state;
    plan_rates r = table();
    for (int lora = 0; lora <= 1; lora++) {
        job_config sft = job(1);
        sft.train.type = lora ? JOB_TRAIN_LORA : JOB_TRAIN_FULL;
        sft.train.global_batch = sft.train.micro_batch = 2;
        step_plan rows2 = plan(&sft, "h200", 1, MODEL_IMAGE_PLAIN, &r);
        near(rows2.step_s, lora ? 2 * 0.093 : 2 * 0.114);
        job_config j = job(1);
        j.train.type = sft.train.type;
        j.train.objective = JOB_OBJECTIVE_ORPO;
        step_plan orpo = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
        near(orpo.step_s, rows2.step_s + 0.002);
        near(orpo.reference_s, 0);
        j.train.objective = JOB_OBJECTIVE_DPO;
        step_plan dpo = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
        near(dpo.step_s, rows2.step_s + 0.002 + 0.050);
        near(dpo.reference_s, 0.050);
        near(dpo.gemm_s, rows2.gemm_s + 0.002 + 2 * 7 * 0.002 + 0.002); /* heads, the layers' linears */
        near(dpo.attention_s, rows2.attention_s + 2 * 0.010);
        near(dpo.tokens_per_s, 2 * 16 / dpo.step_s); /* both rows' tokens */
        assert_int_equal(dpo.mem.activations, rows2.mem.activations);
        assert_int_equal(dpo.mem.trainable, rows2.mem.trainable);
        /* bf16 shards of every unit, each at a 256-byte boundary: 256 -> 512, 592 -> 1280, 264 -> 768 */
        assert_int_equal(dpo.mem.frozen, lora ? rows2.mem.frozen : 512 + 2 * 1280 + 768);
        assert_int_equal(dpo.params, rows2.params + (lora ? 0 : dpo.mem.frozen));
        assert_true(lora ? dpo.mem.total >= rows2.mem.total : dpo.mem.total > rows2.mem.total + dpo.mem.frozen);
    }
    /* two GPUs: the reference gathers each layer once more, unhidden */
    job_config j = job(2);
    j.train.objective = JOB_OBJECTIVE_DPO;
    step_plan p = plan(&j, "h200", 2, MODEL_IMAGE_PLAIN, &r);
    double ag = 592 * 2 * 0.5 / 400e9, rs = 592 * 4 * 0.5 / 400e9;
    near(p.comm_s, 2 * (3 * ag + rs));
    near(p.comm_exposed_s, 2 * ag);
    near(p.reference_s, 0.050 + 2 * ag);
    /* the largest micro_batch that fits counts pairs: a limit of 2 pairs' plan gets 2 (ORPO:
     * the activations are its peak; a full DPO's is its loading, the staging buffer) */
    j = job(1);
    j.train.objective = JOB_OBJECTIVE_ORPO;
    j.train.global_batch = 4;
    j.train.micro_batch = 2;
    j.runtime.gpu_memory_limit = (int64_t)plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).mem.total;
    j.train.micro_batch = 1;
    assert_int_equal(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).max_micro_batch, 2);
}

/* A missing shape takes the nearest row in log space, scaled by the FLOPs: down (16, 16, 8)
 * from a row of 1.5 times the tokens at 1.5 times the times (nearer than (16, 8, 8)). */
static void test_nearest_shape(void **state) {
    (void)state;
    plan_gemm_rate rows[sizeof gemms / sizeof gemms[0]];
    memcpy(rows, gemms, sizeof rows);
    rows[3] = (plan_gemm_rate){24, 16, 8, 1.5, 3, 4.5};
    plan_rates r = table();
    r.gemm = rows;
    job_config j = job(1);
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).step_s, 0.114);
    rows[3] = (plan_gemm_rate){24, 16, 8, 3, 3, 4.5}; /* a slower forward: +1 ms a layer */
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).step_s, 0.116);
}

/* Two GPUs of a node: each layer gathered twice in bf16 and its fp32 gradients reduced, half
 * of each over the 400 GB/s link: 592 elements a layer (7 linears 576, 2 norms 16). */
static void test_communication(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(2);
    step_plan p = plan(&j, "h200", 2, MODEL_IMAGE_PLAIN, &r);
    double ag = 592 * 2 * 0.5 / 400e9, rs = 592 * 4 * 0.5 / 400e9;
    near(p.comm_s, 2 * (2 * ag + rs));
    near(p.comm_exposed_s, 0); /* hidden behind milliseconds of compute */
    near(p.step_s, 0.114);
}

/* shard_grad_op gathers a layer once a micro-batch; hybrid_shard on 2 nodes of 2 shards in a
 * node and all-reduces each rank's half of the gradients across the nodes at a GPU's share of
 * the 50 GB/s network (25 GB/s). */
static void test_strategies(void **state) {
    (void)state;
    plan_rates r = table();
    double ag = 592 * 2 * 0.5 / 400e9, rs = 592 * 4 * 0.5 / 400e9;
    job_config j = job(2);
    j.fsdp.sharding = JOB_SHARD_GRAD_OP;
    near(plan(&j, "h200", 2, MODEL_IMAGE_PLAIN, &r).comm_s, 2 * (ag + rs));
    j = job(4);
    j.runtime.workers_per_node = 2;
    j.fsdp.sharding = JOB_SHARD_HYBRID;
    llama_config c = tiny();
    plan_machine m = {.nodes = 2, .gpus_per_node = 2, .gpu = plan_gpu_find("h200"), .net_gbps = 50};
    step_plan p;
    errbuf err = {{0}};
    if (step_plan_job(&j, &c, MODEL_IMAGE_PLAIN, &m, &r, &p, &err)) fail_msg("%s", err.msg);
    double replica = 2 * (592 * 4 / 2.0) * 0.5 / 25e9;
    near(p.comm_s, 2 * (2 * ag + rs + replica));
    j.fsdp.sharding = JOB_SHARD_FULL; /* one ring of 4 across the nodes, at 25 GB/s */
    if (step_plan_job(&j, &c, MODEL_IMAGE_PLAIN, &m, &r, &p, &err)) fail_msg("%s", err.msg);
    near(p.comm_s, 2 * (2 * 592 * 2 * 0.75 / 25e9 + 592 * 4 * 0.75 / 25e9));
    /* FP8 gathers: of 4 layers, the middle two's 576 projection values as a byte each, their 16
     * norm values and the outer two layers as bf16: 896 bytes a layer on the mean (1,184 bf16) */
    c.num_hidden_layers = 4;
    j.train.precision = JOB_PRECISION_FP8;
    j.train.fp8_all_gather = false;
    if (step_plan_job(&j, &c, MODEL_IMAGE_PLAIN, &m, &r, &p, &err)) fail_msg("%s", err.msg);
    near(p.comm_s, 4 * (2 * 592 * 2 * 0.75 / 25e9 + 592 * 4 * 0.75 / 25e9));
    j.train.fp8_all_gather = true;
    if (step_plan_job(&j, &c, MODEL_IMAGE_PLAIN, &m, &r, &p, &err)) fail_msg("%s", err.msg);
    near(p.comm_s, 4 * (2 * 896 * 0.75 / 25e9 + 592 * 4 * 0.75 / 25e9));
}

/* Another GPU than the table's: compute-bound times x 989 / 312 (A100), unvalidated. */
static void test_other_gpu(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(1);
    step_plan p = plan(&j, "a100-80", 1, MODEL_IMAGE_PLAIN, &r);
    near(p.step_s, 0.114 * 989.0 / 312.0);
    assert_false(p.validated);
    llama_config c = tiny();
    plan_machine m = {.nodes = 1, .gpus_per_node = 1, .gpu = NULL};
    errbuf err = {{0}};
    assert_int_equal(step_plan_job(&j, &c, MODEL_IMAGE_PLAIN, &m, &r, &p, &err), -1);
    assert_non_null(strstr(err.msg, "unknown GPU"));
    assert_null(plan_gpu_find("v100"));
}

/* Memory, host RAM and the checkpoint: the GPU's is fsdp's plan and the context; a node holds
 * the model memory, the checkpoint writer's staging (master, m, v) and 600 MiB a worker; the
 * checkpoint is 12 bytes a trained parameter (embedding 256, layers 2 x 592, head 264). */
static void test_memory_host_checkpoint(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(1);
    j.checkpoint.save_final = true;
    step_plan p = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    llama_config c = tiny();
    llama_layout lo;
    errbuf err = {{0}};
    if (llama_layout_init(&lo, &c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(p.host_model, model_image_bytes_q(&lo, MODEL_IMAGE_BF16, MODEL_IMAGE_PLAIN));
    llama_layout_free(&lo);
    assert_int_equal(p.gpu_bytes, p.mem.total + 1000);
    assert_int_equal(p.ckpt_bytes, 12 * (256 + 2 * 592 + 264));
    assert_int_equal(p.host_ckpt, 12 * p.mem.trainable_elems);
    assert_int_equal(p.host_processes, (size_t)600 << 20);
    assert_int_equal(p.host_total, p.host_model + p.host_ckpt + p.host_processes);
    assert_int_equal(p.host_memory_ckpt, 0);
    j.checkpoint.memory_interval_steps = 1; /* a second image where it fits: outside the total */
    j.checkpoint.save_final = false;
    step_plan q = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    assert_int_equal(q.host_ckpt, p.host_ckpt);
    assert_int_equal(q.host_memory_ckpt, p.host_ckpt);
    assert_int_equal(q.host_total, p.host_total);
    j.checkpoint.memory_interval_steps = 0;
    j.checkpoint.save_final = true;
    near(p.ckpt_write_s, p.ckpt_bytes / 2e9);
    /* the kinds add up to fsdp's categories */
    assert_int_equal(p.params + p.grads + p.optimizer + p.gathered + p.activations + p.workspace - p.context,
                     p.mem.trainable + p.mem.frozen + p.mem.gather_slots + p.mem.grad_slots +
                         p.mem.activations + p.mem.small);
    assert_int_equal(p.max_micro_batch, 1);
}

/* What a worker of job j needs under r (no compute copies, which the plan takes only where
 * they fit). */
static size_t total_with(const job_config *j, llama_recompute r) {
    llama_config c = tiny();
    memory_plan_options o;
    memory_plan m;
    errbuf err = {{0}};
    memory_plan_job_options(j, &c, 1, 0, MODEL_IMAGE_PLAIN, 2, 0, &o);
    o.recompute = r;
    if (memory_plan_compute(&o, &m, &err)) fail_msg("%s", err.msg);
    return m.total;
}

/* The least a worker of job j needs: its plan with a budget of nothing (auto: full
 * recompute; no compute copies). */
static size_t least_total(const job_config *j) {
    llama_config c = tiny();
    memory_plan_options o;
    memory_plan_job_options(j, &c, 1, 0, MODEL_IMAGE_PLAIN, 2, 0, &o);
    return total_with(j, o.recompute);
}

/* fsdp.offload_activations under a limit one byte short of what job j needs without it: one
 * layer input (16 x 8 bf16, 256 bytes) to the host, 20 ms a copy each way. */
static step_plan with_one_input_offloaded(job_config *j, plan_rates *r) {
    j->runtime.gpu_memory_limit = (int64_t)least_total(j) - 1;
    j->fsdp.offload_activations = true;
    r->h2d_gbps = r->d2h_gbps = 256 / 0.020 / 1e9;
    step_plan p = plan(j, "h200", 1, MODEL_IMAGE_PLAIN, r);
    assert_int_equal(p.offload_layers, 1);
    return p;
}

/* F46 under full recompute (125 ms): fsdp.offload_activations under a limit one byte short
 * moves one layer input (16 x 8 bf16, 256 bytes) to the host, counted in host RAM; at 256
 * bytes in 20 ms each way, the copy to the host exceeds a layer's forward (12 ms) by 8 ms, the
 * fetch hides behind a layer's backward (42 ms + its share of the recompute): 133 ms.
 * fsdp.mlp_chunk recomputes the last layer's MLP too (gate and up, 2 ms): 127 ms. */
static void test_long_sequences(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(1);
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_FULL;
    step_plan full = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    near(full.step_s, 0.125);
    size_t least = least_total(&j);
    step_plan p = with_one_input_offloaded(&j, &r);
    assert_int_equal(p.mem.host_activations, 256);
    assert_int_equal(p.mem.total, least - 256);
    assert_int_equal(p.host_offload, 256);
    near(p.offload_exposed_s, 0.008);
    near(p.step_s, 0.133);
    j.fsdp.offload_activations = false;
    j.runtime.gpu_memory_limit = 0;
    j.fsdp.mlp_chunk = 4;
    near(plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r).step_s, 0.127);
}

/* F47: offload_params' base streamed (30 ms a layer each way through the step) beside
 * offload_activations' inputs (20 ms a copy), LoRA on q, full recompute: a layer's forward
 * 14 ms, its backward 37.5 ms (31 and half of the recompute: the first layer's forward but
 * down_proj, 13 ms).  The base alone: 2 x (30 - 14) = 32 ms exposed, its backward copies
 * hidden.  With the first layer's input offloaded too, its copy to the host (the other
 * direction) exceeds that layer's forward by 6 ms, and in the backward its fetch and the
 * base's copy share the host-to-device bandwidth: 30 + 20 - 37.5 = 12.5 ms more. */
static void test_offload_lanes(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(1);
    j.train.type = JOB_TRAIN_LORA;
    j.fsdp.activation_checkpointing = JOB_ACT_CKPT_FULL;
    j.fsdp.offload_params = true;
    size_t layer_bytes = (size_t)(4 * 64 + 3 * 128 - 2 * 32 + 2 * 8) * 2; /* q k v o gate up down, 2 norms, bf16 */
    r.registered_h2d_gbps = layer_bytes / 0.030 / 1e9;
    step_plan base = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    assert_int_equal(base.offload_layers, 0);
    near(base.offload_exposed_s, 0.032);
    step_plan p = with_one_input_offloaded(&j, &r);
    near(p.offload_exposed_s, 0.032 + 0.006 + 0.0125);
    near(p.step_s, base.step_s + 0.0185);
}

/* Compute copies: AdamW's pass writes them (30 bytes a trained element: master, m, v read
 * and written, the gradient read, the copy written), and no gather casts a unit (6 bytes an
 * element, twice a micro-batch): 30 against 28 + 12 bytes, at equal rates; the copies count
 * as parameters.  Under a limit they do not fit, neither. */
static void test_compute_copies(void **state) {
    (void)state;
    plan_rates r = table();
    r.adamw_gbps = r.elementwise_gbps = 1;
    job_config j = job(1);
    step_plan with = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    j.runtime.gpu_memory_limit = (int64_t)least_total(&j);
    step_plan without = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    assert_int_equal(with.compute_copies, 1);
    assert_int_equal(without.compute_copies, 0);
    assert_true(without.optimizer_s > 0);
    near(with.optimizer_s / without.optimizer_s, 30.0 / 40.0);
    assert_int_equal(with.params - without.params, 2 * with.mem.trainable_elems);
}

/* fsdpd's admission: a GPU one byte short of the worker's need (without the compute copies it
 * takes only where they fit), the context and the margin refuses the job, naming both;
 * exactly enough passes; the CPU backend (no GPU) passes. */
static void test_admit(void **state) {
    (void)state;
    plan_rates r = table();
    job_config j = job(1);
    step_plan p = plan(&j, "h200", 1, MODEL_IMAGE_PLAIN, &r);
    assert_int_equal(p.compute_copies, 1); /* on the H200 there is room for them */
    llama_config c = tiny();
    errbuf err = {{0}};
    size_t need = least_total(&j) + 4096 + PLAN_MARGIN_BYTES;
    assert_true(need < p.mem.total + 4096 + PLAN_MARGIN_BYTES);
    assert_int_equal(step_plan_admit(&j, &c, 1, MODEL_IMAGE_PLAIN, 2, need, 4096, &err), 0);
    assert_int_equal(step_plan_admit(&j, &c, 1, MODEL_IMAGE_PLAIN, 2, need - 1, 4096, &err), -1);
    assert_non_null(strstr(err.msg, "the GPU's memory"));
    assert_non_null(strstr(err.msg, "each worker needs"));
    assert_int_equal(step_plan_admit(&j, &c, 1, MODEL_IMAGE_PLAIN, 2, 0, 4096, &err), 0);
    j.runtime.gpu_memory_limit = 1000; /* the limit, as the worker checks it */
    assert_int_equal(step_plan_admit(&j, &c, 1, MODEL_IMAGE_PLAIN, 2, 0, 4096, &err), -1);
    assert_non_null(strstr(err.msg, "runtime.gpu_memory_limit: each worker needs"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_fine_tune),  cmocka_unit_test(test_lora), cmocka_unit_test(test_offload_lanes),
        cmocka_unit_test(test_preference),
        cmocka_unit_test(test_nearest_shape),   cmocka_unit_test(test_communication),
        cmocka_unit_test(test_strategies),
        cmocka_unit_test(test_other_gpu),       cmocka_unit_test(test_memory_host_checkpoint),
        cmocka_unit_test(test_compute_copies),
        cmocka_unit_test(test_admit),           cmocka_unit_test(test_long_sequences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
