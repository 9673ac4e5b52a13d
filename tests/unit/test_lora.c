/* LoRA (model/llama with adapters, worker/fsdp with a frozen base) against PEFT's golden
 * outputs (tests/fixtures/golden/tiny-mha/lora_expected.safetensors: r 8, alpha 16 on every
 * linear, dropout 0, lora_B random; rslora_expected.safetensors: the same with use_rslora,
 * r 16, alpha 16, so the scale alpha / sqrt(r) = 4 is not alpha / r = 1), and dropout (> 0)
 * on its own: reproducible, redrawn the same by a recomputation, and differentiated through
 * correctly (finite differences). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/llama.h"
#include "proto/model_image.h"
#include "worker/fsdp.h"
#include "tests/unit/fixtures.h"

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    assert_non_null(p);
    return p;
}

/* The golden model, batch and expected outputs, opened, and a CPU context to run them in. */
typedef struct golden {
    char dir[512];
    kctx ctx;
    llama_config cfg;
    st_model model;
    st_file batch, expected;
    int B, T;
    int32_t *ids, *labels;
    int64_t count;
} golden;

/* Opens the golden with EXPECTED (a file of golden/tiny-mha) as its expected outputs. */
static void golden_open_with(golden *g, const char *expected) {
    errbuf err = {{0}};
    char path[700];
    fixture_path(g->dir, sizeof g->dir, "golden/tiny-mha");
    /* copies deferred as late as a GPU may run them (k_cpu_defer_copies): offload_params'
     * streams and offload_activations' copies must wait for them */
    if (kctx_init(&g->ctx, K_CPU, 0, &err) || k_cpu_defer_copies(&g->ctx, &err) ||
        llama_config_load(&g->cfg, g->dir, &err) || st_model_open(&g->model, g->dir, &err))
        fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/batch.safetensors", g->dir);
    if (st_open(&g->batch, path, &err)) fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/%s", g->dir, expected);
    if (st_open(&g->expected, path, &err)) fail_msg("%s", err.msg);
    const st_tensor *ids = st_find(&g->batch, "input_ids"), *labels = st_find(&g->batch, "labels");
    assert_non_null(ids);
    assert_non_null(labels);
    g->B = (int)ids->shape[0], g->T = (int)ids->shape[1];
    size_t N = (size_t)g->B * g->T;
    g->ids = xcalloc(N, sizeof *g->ids);
    g->labels = xcalloc(N, sizeof *g->labels);
    memcpy(g->ids, ids->data, N * sizeof *g->ids);
    memcpy(g->labels, labels->data, N * sizeof *g->labels);
    int32_t *shifted = xcalloc(N, sizeof *shifted);
    g->count = k_shift_labels(g->labels, shifted, g->B, g->T);
    free(shifted);
}

static void golden_open(golden *g) { golden_open_with(g, "lora_expected.safetensors"); }

static void golden_close(golden *g) {
    kctx_destroy(&g->ctx);
    free(g->ids);
    free(g->labels);
    st_close(&g->batch);
    st_close(&g->expected);
    st_model_close(&g->model);
}

/* The golden's settings: r 8, alpha 16, every linear. */
static lora_config golden_lora(double dropout) {
    return (lora_config){.rank = 8, .alpha = 16, .dropout = dropout, .targets = LORA_ALL_LINEAR};
}

/* rslora_expected's: r 16, alpha 16, use_rslora, every linear, dropout 0. */
static lora_config golden_rslora(void) {
    return (lora_config){.rank = 16, .alpha = 16, .rslora = 1, .targets = LORA_ALL_LINEAR};
}

/* The expected tensor `prefix` + a PEFT saved name with PEFT's in-memory ".default" put back
 * ("...lora_A.weight" -> "...lora_A.default.weight"), as host fp32 of n elements. */
static const float *expected_adapter(const golden *g, const char *prefix, const char *name, size_t n) {
    char full[300];
    const char *dot = strstr(name, ".weight");
    assert_non_null(dot);
    snprintf(full, sizeof full, "%s%.*s.default.weight", prefix, (int)(dot - name), name);
    const st_tensor *t = st_find(&g->expected, full);
    if (!t) fail_msg("the expected file has no %s", full);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->numel, n);
    return t->data;
}

static double check(const char *what, const float *got, const float *want, size_t n, double tol) {
    double e = rel_error(got, want, n);
    if (e > tol) fail_msg("%s: relative error %.3e > %.0e", what, e, tol);
    return e;
}

/* A model with the golden base and adapters lc from init.*; checkpoint_activations as given. */
static void golden_model_with(llama_model *m, golden *g, lora_config lc, int ckpt) {
    errbuf err = {{0}};
    if (llama_model_init(m, &g->cfg, &g->ctx, ckpt, &err) || llama_model_load_hf(m, &g->model, &err) ||
        llama_model_init_lora(m, &lc, 42, &err))
        fail_msg("%s", err.msg);
    const lora_layout *ll = &m->lora_layout;
    for (int i = 0; i < ll->n_tensors; i++) {
        const llama_tensor_slot *s = &ll->tensors[i];
        if (llama_model_set_param(m, s->name, expected_adapter(g, "init.", s->name, s->numel),
                                  s->numel, &err))
            fail_msg("%s", err.msg);
    }
}

static void golden_model(llama_model *m, golden *g, double dropout, int ckpt) {
    golden_model_with(m, g, golden_lora(dropout), ckpt);
}

static void run(llama_model *m, const golden *g, float *loss, float *logits) {
    errbuf err = {{0}};
    float loss_sum;
    int64_t count;
    llama_model_zero_grad(m);
    if (llama_model_forward_backward(m, g->ids, g->labels, g->B, g->T, (float)(1.0 / g->count),
                                     &loss_sum, &count, logits, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(count, g->count);
    *loss = (float)((double)loss_sum / (double)count);
}

/* Every adapter gradient (host fp32, concatenated in layout order). */
static float *adapter_grads(llama_model *m) {
    errbuf err = {{0}};
    const lora_layout *ll = &m->lora_layout;
    size_t total = 0;
    for (int i = 0; i < ll->n_tensors; i++) total += ll->tensors[i].numel;
    float *all = xcalloc(total, sizeof *all), *at = all;
    for (int i = 0; i < ll->n_tensors; i++) {
        if (llama_model_get_grad(m, ll->tensors[i].name, at, ll->tensors[i].numel, &err))
            fail_msg("%s", err.msg);
        at += ll->tensors[i].numel;
    }
    return all;
}

/* (1) logits, loss, every adapter gradient and one AdamW step, as PEFT computes them: with
 * the adapters lc from the golden file EXPECTED. */
static void check_golden_model(const char *expected, lora_config lc) {
    golden g;
    golden_open_with(&g, expected);
    errbuf err = {{0}};
    llama_model m;
    golden_model_with(&m, &g, lc, 0);
    size_t N = (size_t)g.B * g.T, V = (size_t)g.cfg.vocab_size;
    float *logits = xcalloc(N * V, sizeof *logits), loss;
    run(&m, &g, &loss, logits);
    const st_tensor *want_logits = st_find(&g.expected, "logits"), *want_loss = st_find(&g.expected, "loss");
    assert_non_null(want_logits);
    assert_non_null(want_loss);
    double e_logits = check("logits", logits, want_logits->data, N * V, 1e-5);
    double e_loss = check("loss", &loss, want_loss->data, 1, 1e-5);

    /* The base is frozen: it has no gradient at all. */
    float probe[4];
    assert_int_equal(llama_model_get_grad(&m, "model.norm.weight", probe, (size_t)g.cfg.hidden_size, &err), -1);
    assert_non_null(strstr(err.msg, "frozen"));

    const lora_layout *ll = &m.lora_layout;
    double worst_grad = 0, worst_adamw = 0;
    for (int i = 0; i < ll->n_tensors; i++) {
        const llama_tensor_slot *s = &ll->tensors[i];
        float *grad = xcalloc(s->numel, sizeof *grad), *p = xcalloc(s->numel, sizeof *p);
        float *mom = xcalloc(s->numel, sizeof *mom), *var = xcalloc(s->numel, sizeof *var);
        if (llama_model_get_grad(&m, s->name, grad, s->numel, &err) ||
            llama_model_get_param(&m, s->name, p, s->numel, &err))
            fail_msg("%s", err.msg);
        double e = check(s->name, grad, expected_adapter(&g, "grad.", s->name, s->numel), s->numel, 1e-5);
        worst_grad = e > worst_grad ? e : worst_grad;
        k_adamw(&g.ctx, p, grad, mom, var, s->numel, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f, NULL);
        e = check(s->name, p, expected_adapter(&g, "adamw.", s->name, s->numel), s->numel, 1e-5);
        worst_adamw = e > worst_adamw ? e : worst_adamw;
        free(grad), free(p), free(mom), free(var);
    }
    assert_int_equal(ll->n_tensors, 2 * 7 * g.cfg.num_hidden_layers);
    printf("%s: logits %.2e, loss %.2e, worst adapter grad %.2e, worst adamw %.2e\n",
           expected, e_logits, e_loss, worst_grad, worst_adamw);
    free(logits);
    llama_model_destroy(&m);
    golden_close(&g);
}

static void test_golden_lora(void **state) {
    (void)state;
    check_golden_model("lora_expected.safetensors", golden_lora(0.0));
}

/* rsLoRA: PEFT's use_rslora scale alpha / sqrt(r) (proto/lora_layout.c lora_scale). */
static void test_golden_rslora(void **state) {
    (void)state;
    check_golden_model("rslora_expected.safetensors", golden_rslora());
}

/* (2) dropout > 0: the same bits on a second run and after recomputation (activation
 * checkpointing redraws every mask), other bits for other samples, and not the
 * dropout-free result. */
static void test_dropout_reproducible(void **state) {
    (void)state;
    golden g;
    golden_open(&g);
    llama_model plain, ckpt, none;
    golden_model(&plain, &g, 0.3, 0);
    golden_model(&ckpt, &g, 0.3, 1);
    golden_model(&none, &g, 0.0, 0);
    float l1, l2, l3, l4, l0;
    run(&plain, &g, &l1, NULL);
    float *g1 = adapter_grads(&plain);
    run(&plain, &g, &l2, NULL);
    float *g2 = adapter_grads(&plain);
    run(&ckpt, &g, &l3, NULL);
    float *g3 = adapter_grads(&ckpt);
    run(&none, &g, &l0, NULL);
    float *g0 = adapter_grads(&none);
    size_t n = 0;
    for (int i = 0; i < plain.lora_layout.n_tensors; i++) n += plain.lora_layout.tensors[i].numel;
    assert_true(l1 == l2 && l1 == l3);
    assert_memory_equal(g1, g2, n * sizeof *g1);
    assert_memory_equal(g1, g3, n * sizeof *g1);
    assert_true(l0 != l1);
    assert_true(rel_error(g1, g0, n) > 1e-3);
    plain.first_sample = 1000; /* other samples: other masks */
    run(&plain, &g, &l4, NULL);
    assert_true(l4 != l1);
    printf("dropout 0.3: loss %.6f (none %.6f, samples from 1000 %.6f); recomputed bits equal\n",
           l1, l0, l4);
    free(g0), free(g1), free(g2), free(g3);
    llama_model_destroy(&plain);
    llama_model_destroy(&ckpt);
    llama_model_destroy(&none);
    golden_close(&g);
}

/* (2b) Adapters on some modules: q and v one group of two (k between them not adapted), gate
 * and up one, k alone, up alone.  Each against the every-linear model whose other adapters'
 * lora_B are zero (they add nothing, and their dt is zero): the same logits and the same
 * gradients of the adapted modules, so each member reads and writes its own columns of the
 * group's inner activations. */
static void check_partial_targets(golden *g, unsigned targets) {
    errbuf err = {{0}};
    llama_model part, all;
    lora_config lc = golden_lora(0.0);
    lc.targets = targets;
    golden_model_with(&part, g, lc, 1);
    golden_model(&all, g, 0.0, 1);
    const lora_layout *la = &all.lora_layout;
    for (int i = 0; i < la->n_tensors; i++) {
        const llama_tensor_slot *s = &la->tensors[i];
        int which, module = lora_tensor_module(la, s, &which);
        if (which != 1 || (targets >> module & 1u)) continue;
        float *zero = xcalloc(s->numel, sizeof *zero);
        if (llama_model_set_param(&all, s->name, zero, s->numel, &err)) fail_msg("%s", err.msg);
        free(zero);
    }
    size_t NV = (size_t)g->B * g->T * (size_t)g->cfg.vocab_size;
    float *lp = xcalloc(NV, sizeof *lp), *la_logits = xcalloc(NV, sizeof *la_logits), loss_p, loss_a;
    run(&part, g, &loss_p, lp);
    run(&all, g, &loss_a, la_logits);
    check("partial logits", lp, la_logits, NV, 1e-6);
    const lora_layout *lpart = &part.lora_layout;
    double worst = 0;
    for (int i = 0; i < lpart->n_tensors; i++) {
        const llama_tensor_slot *s = &lpart->tensors[i];
        float *gp = xcalloc(s->numel, sizeof *gp), *ga = xcalloc(s->numel, sizeof *ga);
        if (llama_model_get_grad(&part, s->name, gp, s->numel, &err) ||
            llama_model_get_grad(&all, s->name, ga, s->numel, &err))
            fail_msg("%s", err.msg);
        double e = check(s->name, gp, ga, s->numel, 1e-5);
        worst = e > worst ? e : worst;
        free(gp), free(ga);
    }
    printf("targets 0x%02x: %d adapter tensors, worst gradient %.2e against every linear\n", targets,
           lpart->n_tensors, worst);
    free(lp), free(la_logits);
    llama_model_destroy(&part);
    llama_model_destroy(&all);
}

/* Which adapters run as one: q/k/v and gate/up among the adapted, without dropout, at a rank
 * of 8 or a multiple. */
static void test_lora_groups(void **state) {
    (void)state;
    lora_config all = golden_lora(0.0);
    llama_lora_group g = llama_lora_group_of(&all, LORA_K);
    assert_int_equal(g.n, 3);
    assert_int_equal(g.column, 1);
    assert_int_equal(g.member[2], LORA_V);
    g = llama_lora_group_of(&all, LORA_UP);
    assert_int_equal(g.n, 2);
    assert_int_equal(g.column, 1);
    assert_int_equal(llama_lora_group_of(&all, LORA_O).n, 1);
    assert_int_equal(llama_lora_group_of(&all, LORA_DOWN).n, 1);
    lora_config qv = all;
    qv.targets = 1u << LORA_Q | 1u << LORA_V | 1u << LORA_GATE;
    g = llama_lora_group_of(&qv, LORA_V);
    assert_int_equal(g.n, 2);
    assert_int_equal(g.column, 1);
    assert_int_equal(g.member[0], LORA_Q);
    assert_int_equal(llama_lora_group_of(&qv, LORA_GATE).n, 1); /* up not adapted */
    assert_int_equal(llama_lora_group_of(&qv, LORA_K).n, 1);    /* not adapted itself */
    lora_config dropped = all, odd = all;
    dropped.dropout = 0.1;
    odd.rank = 12;
    assert_int_equal(llama_lora_group_of(&dropped, LORA_Q).n, 1);
    assert_int_equal(llama_lora_group_of(&odd, LORA_Q).n, 1);
}

static void test_partial_targets(void **state) {
    (void)state;
    golden g;
    golden_open(&g);
    check_partial_targets(&g, 1u << LORA_Q | 1u << LORA_V | 1u << LORA_UP | 1u << LORA_DOWN);
    check_partial_targets(&g, 1u << LORA_K | 1u << LORA_GATE | 1u << LORA_UP | 1u << LORA_O);
    golden_close(&g);
}

/* (3) The gradient through dropped-out inputs is the loss's: central differences on the
 * largest-gradient element of each adapted module's lora_A of layer 0 (whose input is what
 * dropout masks). */
static void test_dropout_gradient(void **state) {
    (void)state;
    golden g;
    golden_open(&g);
    errbuf err = {{0}};
    llama_model m;
    golden_model(&m, &g, 0.3, 0);
    float loss;
    run(&m, &g, &loss, NULL);
    const lora_layout *ll = &m.lora_layout;
    int checked = 0;
    for (int i = 0; i < ll->n_tensors; i++) {
        const llama_tensor_slot *s = &ll->tensors[i];
        int which, module = lora_tensor_module(ll, s, &which);
        if (s->unit != 0 || which != 0) continue;
        float *grad = xcalloc(s->numel, sizeof *grad), *p = xcalloc(s->numel, sizeof *p);
        if (llama_model_get_grad(&m, s->name, grad, s->numel, &err) ||
            llama_model_get_param(&m, s->name, p, s->numel, &err))
            fail_msg("%s", err.msg);
        size_t best = 0;
        for (size_t e = 1; e < s->numel; e++) best = fabsf(grad[e]) > fabsf(grad[best]) ? e : best;
        float keep = p[best], h = 0.02f, lp, lm;
        p[best] = keep + h;
        if (llama_model_set_param(&m, s->name, p, s->numel, &err)) fail_msg("%s", err.msg);
        run(&m, &g, &lp, NULL);
        p[best] = keep - h;
        if (llama_model_set_param(&m, s->name, p, s->numel, &err)) fail_msg("%s", err.msg);
        run(&m, &g, &lm, NULL);
        p[best] = keep;
        if (llama_model_set_param(&m, s->name, p, s->numel, &err)) fail_msg("%s", err.msg);
        double fd = ((double)lp - lm) / (2.0 * h), an = grad[best];
        if (fabs(fd - an) > 0.03 * fabs(an) + 1e-5)
            fail_msg("%s (%s) [%zu]: analytic %.6e, central difference %.6e", s->name,
                     lora_module_name(module), best, an, fd);
        checked++;
        free(grad), free(p);
    }
    assert_int_equal(checked, 7);
    llama_model_destroy(&m);
    golden_close(&g);
}

/* Collects the gathered adapters (fsdp_gather_params) and compares each with adamw.*. */
typedef struct adamw_check {
    const golden *g;
    double worst;
    int n;
} adamw_check;

static int check_adamw(const llama_tensor_slot *slot, const float *data, void *arg, errbuf *err) {
    (void)err;
    adamw_check *a = arg;
    double e = check(slot->name, data, expected_adapter(a->g, "adamw.", slot->name, slot->numel),
                     slot->numel, 1e-5);
    a->worst = e > a->worst ? e : a->worst;
    a->n++;
    return 0;
}

/* The golden's init.* adapters as full host units (freed by free_units), set into f, then one
 * step on the golden batch (AdamW lr 1e-3, betas 0.9/0.95, eps 1e-8, no decay, no clipping). */
static float **golden_step(fsdp *f, const golden *g, fsdp_step_result *res) {
    errbuf err = {{0}};
    const lora_layout *ll = &f->lora_layout;
    float **units = xcalloc((size_t)ll->n_units, sizeof *units);
    for (int u = 0; u < ll->n_units; u++) units[u] = xcalloc(ll->units[u].numel, sizeof(float));
    for (int i = 0; i < ll->n_tensors; i++) {
        const llama_tensor_slot *s = &ll->tensors[i];
        memcpy(units[s->unit] + s->offset, expected_adapter(g, "init.", s->name, s->numel),
               s->numel * sizeof(float));
    }
    if (fsdp_set_adapters(f, units, &err)) fail_msg("%s", err.msg);
    fsdp_hparams hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_batch b = {.input_ids = g->ids, .labels = g->labels, .n_micro = 1, .micro_batch = g->B, .T = g->T};
    if (fsdp_train_step(f, &b, &hp, res, &err)) fail_msg("%s", err.msg);
    return units;
}

/* The adapters fsdp trained against the step computed from the golden gradients. */
typedef struct qlora_check {
    float **units;
    double *worst;
    int n;
} qlora_check;

static int check_qlora_step(const llama_tensor_slot *slot, const float *data, void *arg, errbuf *err) {
    (void)err;
    qlora_check *q = arg;
    double e = check(slot->name, data, q->units[slot->unit] + slot->offset, slot->numel, 1e-4);
    *q->worst = e > *q->worst ? e : *q->worst;
    q->n++;
    return 0;
}

/* (4) worker/fsdp with a frozen base: one optimizer step from init.* on one rank gives
 * PEFT's loss and AdamW step, and the base is untouched (adapters lc, golden file EXPECTED). */
static void check_fsdp_step(const char *expected, lora_config lc) {
    golden g;
    golden_open_with(&g, expected);
    errbuf err = {{0}};
    fsdp f;
    fsdp_options opt = {.sharding = JOB_SHARD_FULL, .lora = &lc, .seed = 42};
    if (fsdp_init(&f, &g.cfg, &g.ctx, NULL, 0, 1, &opt, &err))
        fail_msg("%s", err.msg);
    size_t bytes = model_image_bytes(&f.layout, MODEL_IMAGE_F32);
    void *image = xcalloc(1, bytes);
    if (model_image_fill_hf(image, &f.layout, MODEL_IMAGE_F32, &g.model, NULL, NULL, &err) ||
        fsdp_load_image(&f, image, bytes, &err))
        fail_msg("%s", err.msg);
    const lora_layout *ll = &f.lora_layout;
    fsdp_step_result res;
    float **units = golden_step(&f, &g, &res);
    const st_tensor *want_loss = st_find(&g.expected, "loss");
    float loss = (float)res.loss;
    check("loss", &loss, want_loss->data, 1, 1e-5);
    adamw_check a = {.g = &g};
    if (fsdp_gather_params(&f, check_adamw, &a, &err)) fail_msg("%s", err.msg);
    assert_int_equal(a.n, ll->n_tensors);
    /* the frozen embedding still holds the base's weights */
    const st_tensor *embed = st_model_find(&g.model, "model.embed_tokens.weight");
    assert_non_null(embed);
    assert_memory_equal(f.frozen[LLAMA_EMBED_UNIT].param, embed->data, embed->nbytes);
    printf("fsdp step (%s): loss %.7f, worst adamw %.2e over %d adapters\n", expected, res.loss, a.worst, a.n);
    for (int u = 0; u < ll->n_units; u++) free(units[u]);
    free(units);
    free(image);
    fsdp_destroy(&f);
    golden_close(&g);
}

static void test_fsdp_lora_step(void **state) {
    (void)state;
    check_fsdp_step("lora_expected.safetensors", golden_lora(0.0));
}

static void test_fsdp_rslora_step(void **state) {
    (void)state;
    check_fsdp_step("rslora_expected.safetensors", golden_rslora());
}

/* (5) QLoRA through worker/fsdp: the golden model quantized into an NF4 image (the same
 * bytes as the image of the bitsandbytes directory bnb4/), one step from qlora_expected's
 * init.*: PEFT + bitsandbytes's loss (1e-4), and the adapters after one AdamW step equal
 * that step from the golden gradients (1e-4). */
static void test_fsdp_qlora_step(void **state) {
    (void)state;
    golden g;
    golden_open(&g);
    char path[700];
    st_file qexp;
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/qlora_expected.safetensors", g.dir);
    if (st_open(&qexp, path, &err)) fail_msg("%s", err.msg);
    st_file keep = g.expected;
    g.expected = qexp; /* expected_adapter reads the QLoRA golden */
    lora_config lc = golden_lora(0.0);
    fsdp f;
    fsdp_options opt = {.sharding = JOB_SHARD_FULL, .lora = &lc, .seed = 42, .quant = MODEL_IMAGE_NF4_DQ};
    if (fsdp_init(&f, &g.cfg, &g.ctx, NULL, 0, 1, &opt, &err))
        fail_msg("%s", err.msg);
    size_t bytes = model_image_bytes_q(&f.layout, MODEL_IMAGE_F32, MODEL_IMAGE_NF4_DQ);
    void *image = xcalloc(1, bytes), *from_bnb = xcalloc(1, bytes);
    st_model bnb;
    snprintf(path, sizeof path, "%s/bnb4", g.dir);
    if (st_model_open(&bnb, path, &err) ||
        model_image_fill_nf4(image, &f.layout, MODEL_IMAGE_F32, MODEL_IMAGE_NF4_DQ, &g.model, 0, 0, NULL, NULL, &err) ||
        model_image_fill_nf4(from_bnb, &f.layout, MODEL_IMAGE_F32, MODEL_IMAGE_NF4_DQ, &bnb, 1, 0, NULL, NULL, &err) ||
        model_image_check(image, bytes, &f.layout, &err))
        fail_msg("%s", err.msg);
    assert_memory_equal(image, from_bnb, bytes);
    /* an image of the wrong quantization is refused */
    void *single = xcalloc(1, model_image_bytes_q(&f.layout, MODEL_IMAGE_F32, MODEL_IMAGE_NF4));
    if (model_image_fill_nf4(single, &f.layout, MODEL_IMAGE_F32, MODEL_IMAGE_NF4, &g.model, 0, 0, NULL, NULL, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(fsdp_load_image(&f, single, model_image_bytes_q(&f.layout, MODEL_IMAGE_F32, MODEL_IMAGE_NF4), &err), -1);
    assert_non_null(strstr(err.msg, "NF4"));
    if (fsdp_load_image(&f, image, bytes, &err)) fail_msg("%s", err.msg);

    const lora_layout *ll = &f.lora_layout;
    fsdp_step_result res;
    float **units = golden_step(&f, &g, &res);
    float loss = (float)res.loss;
    check("loss", &loss, st_find(&g.expected, "loss")->data, 1, 1e-4);
    /* the step PEFT + bitsandbytes would take: AdamW from the golden gradients */
    double worst = 0;
    for (int i = 0; i < ll->n_tensors; i++) {
        const llama_tensor_slot *s = &ll->tensors[i];
        float *p = units[s->unit] + s->offset, *mom = xcalloc(s->numel, sizeof *mom);
        float *var = xcalloc(s->numel, sizeof *var), *grad = xcalloc(s->numel, sizeof *grad);
        memcpy(grad, expected_adapter(&g, "grad.", s->name, s->numel), s->numel * sizeof *grad);
        k_adamw(&g.ctx, p, grad, mom, var, s->numel, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f, NULL);
        free(mom), free(var), free(grad);
    }
    qlora_check q = {.units = units, .worst = &worst};
    if (fsdp_gather_params(&f, check_qlora_step, &q, &err)) fail_msg("%s", err.msg);
    assert_int_equal(q.n, ll->n_tensors);
    printf("fsdp qlora step: loss %.7f (golden %.7f), adapters after a step within %.2e\n", res.loss,
           (double)*(const float *)st_find(&g.expected, "loss")->data, worst);
    for (int u = 0; u < ll->n_units; u++) free(units[u]);
    free(units), free(image), free(from_bnb), free(single);
    st_model_close(&bnb);
    fsdp_destroy(&f);
    g.expected = keep;
    st_close(&qexp);
    golden_close(&g);
}

/* (6) Offload and activation checkpointing: a LoRA and a QLoRA job with fsdp.cpu_offload,
 * offload_params or both, or with any activation checkpointing, give the bits of the job
 * without (three steps with dropout, clipping and weight decay, and an evaluation): the host
 * optimizer is the CPU backend's AdamW, a frozen unit streamed from the image is the one that
 * was loaded, and a recomputation redraws the same dropout masks. */
typedef struct flat_adapters {
    float *data;
    size_t n;
} flat_adapters;

static int append_adapter(const llama_tensor_slot *slot, const float *data, void *arg, errbuf *err) {
    (void)err;
    flat_adapters *a = arg;
    memcpy(a->data + a->n, data, slot->numel * sizeof *data);
    a->n += slot->numel;
    return 0;
}

static void run_adapters(golden *g, const void *image, size_t bytes, model_image_quant q,
                         int cpu_offload, int offload_params, llama_recompute recompute,
                         int offload_layers, int mlp_chunk, int copies, double *losses, flat_adapters *out) {
    errbuf err = {{0}};
    lora_config lc = golden_lora(mlp_chunk ? 0.0 : 0.1); /* fsdp.mlp_chunk: without dropout */
    fsdp f;
    fsdp_options opt = {.sharding = JOB_SHARD_FULL, .lora = &lc, .seed = 42, .quant = q,
                        .cpu_offload = cpu_offload, .offload_params = offload_params,
                        .recompute = recompute, .offload_threads = 2, .offload_layers = offload_layers,
                        .mlp_chunk = mlp_chunk, .forward_prefetch = 1, .backward_prefetch = 1, /* the jobs' defaults */
                        .compute_copies = copies};
    if (fsdp_init(&f, &g->cfg, &g->ctx, NULL, 0, 1, &opt, &err) ||
        fsdp_load_image(&f, image, bytes, &err) || fsdp_init_adapters(&f, &err))
        fail_msg("%s", err.msg);
    fsdp_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.01,
                       .clip_norm = 0.5};
    fsdp_batch b = {.input_ids = g->ids, .labels = g->labels, .n_micro = 1, .micro_batch = g->B, .T = g->T};
    for (int s = 0; s < 3; s++) {
        fsdp_step_result res;
        if (fsdp_train_step(&f, &b, &hp, &res, &err)) fail_msg("%s", err.msg);
        losses[s] = res.loss;
    }
    int64_t count;
    if (fsdp_eval_loss(&f, &b, &losses[3], &count, &err)) fail_msg("%s", err.msg);
    size_t n = 0;
    for (int i = 0; i < f.lora_layout.n_tensors; i++) n += f.lora_layout.tensors[i].numel;
    out->data = xcalloc(n, sizeof *out->data);
    out->n = 0;
    if (fsdp_gather_params(&f, append_adapter, out, &err)) fail_msg("%s", err.msg);
    fsdp_destroy(&f);
}

static void test_fsdp_offload_same_bits(void **state) {
    (void)state;
    golden g;
    golden_open(&g);
    errbuf err = {{0}};
    llama_layout lo;
    if (llama_layout_init(&lo, &g.cfg, &err)) fail_msg("%s", err.msg);
    for (int qi = 0; qi < 2; qi++) {
        model_image_quant q = qi ? MODEL_IMAGE_NF4_DQ : MODEL_IMAGE_PLAIN;
        size_t bytes = model_image_bytes_q(&lo, MODEL_IMAGE_F32, q);
        void *image = xcalloc(1, bytes);
        if ((q == MODEL_IMAGE_PLAIN
                 ? model_image_fill_hf(image, &lo, MODEL_IMAGE_F32, &g.model, NULL, NULL, &err)
                 : model_image_fill_nf4(image, &lo, MODEL_IMAGE_F32, q, &g.model, 0, 0, NULL, NULL, &err)))
            fail_msg("%s", err.msg);
        double want[4], got[4];
        flat_adapters a, b;
        run_adapters(&g, image, bytes, q, 0, 0, (llama_recompute){0}, 0, 0, 0, want, &a);
        assert_true(want[2] < want[0]); /* it trains */
        /* offload, then activation checkpointing: full, selective, and (auto's mix) the last
         * layer whole and the other's attention (the MLP recomputed: with the down adapter's
         * inner activation, without down_proj); then full with the first layer's input on
         * the host (fsdp.offload_activations), alone and with offload_params */
        static const llama_recompute recomputes[] = {{2, LLAMA_KEEP_INPUT}, {2, LLAMA_KEEP_ATTENTION},
                                                     {1, LLAMA_KEEP_ATTENTION}};
        assert_int_equal(g.cfg.num_hidden_layers, 2);
        /* each with the copies deferred (as late as a GPU's copy lanes may run them: a
         * missing wait reads stale data) and, where anything is copied, run at once (as early
         * as they may: a copy into a buffer compute still reads changes it) */
        for (int mode = 1; mode < 9 * 2; mode++) {
            int at_once = mode >= 9, m = mode % 9;
            if (m == 0 || (at_once && m != 2 && m != 3 && m != 7 && m != 8)) continue;
            llama_recompute r = m < 4 ? (llama_recompute){0} : recomputes[m < 7 ? m - 4 : 0];
            int offload = m < 4 ? m : m == 8 ? 2 : 0, inputs = m >= 7;
            kctx deferred = g.ctx;
            if (at_once && kctx_init(&g.ctx, K_CPU, 0, &err)) fail_msg("%s", err.msg);
            run_adapters(&g, image, bytes, q, offload & 1, offload >> 1, r, inputs, 0, 0, got, &b);
            if (at_once) kctx_destroy(&g.ctx), g.ctx = deferred;
            printf("%s, cpu_offload %d, offload_params %d, recompute %d x %d, %d layer input offloaded, copies %s: "
                   "losses %.7f %.7f %.7f, eval %.7f\n", qi ? "qlora" : "lora", offload & 1, offload >> 1, r.layers,
                   (int)r.keep, inputs, at_once ? "at once" : "deferred", got[0], got[1], got[2], got[3]);
            assert_memory_equal(want, got, sizeof want);
            assert_int_equal(a.n, b.n);
            assert_memory_equal(a.data, b.data, a.n * sizeof *a.data);
            free(b.data);
        }
        /* compute copies (the adapters' AdamW writing them, read in place): alone, with the
         * base streamed, with full recompute */
        for (int c = 0; c < 3; c++) {
            run_adapters(&g, image, bytes, q, 0, c == 1, c == 2 ? recomputes[0] : (llama_recompute){0}, 0, 0, 1, got,
                         &b);
            printf("%s, compute copies, offload_params %d, recompute %d: losses %.7f %.7f %.7f, eval %.7f\n",
                   qi ? "qlora" : "lora", c == 1, c == 2, got[0], got[1], got[2], got[3]);
            assert_memory_equal(want, got, sizeof want);
            assert_int_equal(a.n, b.n);
            assert_memory_equal(a.data, b.data, a.n * sizeof *a.data);
            free(b.data);
        }
        /* every layer, or the first, keeping its input and h (recomputed but o_proj: its
         * adapter's inner activation alone), or also the attention's output (recomputed but
         * the attention and o_proj) */
        for (int k = 0; k < 4; k++) {
            int layers = 1 + k % 2;
            llama_keep keep = k < 2 ? LLAMA_KEEP_RESIDUAL : LLAMA_KEEP_CONTEXT;
            run_adapters(&g, image, bytes, q, 0, 0, (llama_recompute){layers, keep}, 0, 0, 0, got, &b);
            printf("%s, recompute %d x %s: losses %.7f %.7f %.7f, eval %.7f\n", qi ? "qlora" : "lora", layers,
                   llama_keep_name(keep), got[0], got[1], got[2], got[3]);
            assert_memory_equal(want, got, sizeof want);
            assert_int_equal(a.n, b.n);
            assert_memory_equal(a.data, b.data, a.n * sizeof *a.data);
            free(b.data);
        }
        free(a.data);
        /* fsdp.mlp_chunk (dropout 0): the MLP in chunks of 3 rows, full, h kept and selective recompute,
         * against chunks of every row (all at once: mlp_chunk >= the rows, dropout 0 as
         * well): the first forward the same bits, then fp32 rounding (the weights' gradients
         * summed chunk by chunk) */
        for (int keep = LLAMA_KEEP_INPUT; keep <= LLAMA_KEEP_ATTENTION; keep++) {
            llama_recompute r = {2, (llama_keep)keep};
            run_adapters(&g, image, bytes, q, 0, 0, r, 0, 1 << 20, 0, want, &a);
            run_adapters(&g, image, bytes, q, 0, 0, r, 0, 3, 0, got, &b);
            printf("%s, mlp_chunk 3, recompute 2 x %d: losses %.7f %.7f %.7f vs %.7f %.7f %.7f\n", qi ? "qlora" : "lora",
                   keep, want[0], want[1], want[2], got[0], got[1], got[2]);
            assert_true(want[0] == got[0]);
            for (int s = 1; s < 4; s++) assert_true(fabs(want[s] - got[s]) <= 1e-5 * fabs(want[s]));
            double worst = 0;
            for (size_t i = 0; i < a.n; i++) worst = fmax(worst, fabs(a.data[i] - b.data[i]));
            printf("  adapters: largest difference %.3e\n", worst);
            /* AdamW's step (lr 1e-2) of a near-zero gradient moves with its rounding: 2% of a step */
            assert_true(worst <= 2e-4);
            free(a.data);
            free(b.data);
        }
        free(image);
    }
    llama_layout_free(&lo);
    golden_close(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_lora),
        cmocka_unit_test(test_golden_rslora),
        cmocka_unit_test(test_dropout_reproducible),
        cmocka_unit_test(test_lora_groups),
        cmocka_unit_test(test_partial_targets),
        cmocka_unit_test(test_dropout_gradient),
        cmocka_unit_test(test_fsdp_lora_step),
        cmocka_unit_test(test_fsdp_rslora_step),
        cmocka_unit_test(test_fsdp_qlora_step),
        cmocka_unit_test(test_fsdp_offload_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
