/* worker/fsdp: packed micro-batches through fsdp_train_step (one rank, CPU backend), and
 * CPU offload giving the bits of a run without it.
 *
 * A step over rows packed with documents (positions restarting at each) has the loss, the
 * target count and the gradient norm of a step over the same documents as rows of their
 * own, padded: the document bounds reach every layer's RoPE and attention (varlen), and the loss
 * is normalised by the real label count.  lr = 0 keeps the parameters, so both steps run on
 * one model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/model_image.h"
#include "proto/rng.h"
#include "worker/fsdp.h"

enum { ROWS = 2, T = 16, DOCS = 7 };
/* each row's document lengths, 0-terminated, summing to T */
static const int lens[ROWS][5] = {{1, 5, 3, 7}, {6, 1, 9}};

static llama_config tiny_config(void) {
    llama_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 4;
    c.vocab_size = 29;
    c.max_position_embeddings = 32;
    c.rms_norm_eps = 1e-5;
    c.bos_token_id = c.eos_token_id = -1;
    c.rope = (rope_config){.type = ROPE_DEFAULT, .theta = 100.0};
    return c;
}

/* One rank on the CPU, every master shard (the whole unit) random. */
static void init_fsdp(fsdp *f, kctx *c, const llama_config *cfg) {
    errbuf err = {{0}};
    fsdp_options opt = {.sharding = JOB_SHARD_FULL};
    if (kctx_init(c, K_CPU, 0, &err) || fsdp_init(f, cfg, c, NULL, 0, 1, &opt, &err))
        fail_msg("%s", err.msg);
    for (int u = 0; u < f->layout.n_units; u++) {
        const fsdp_unit *U = &f->units[u];
        float *w = calloc(U->shard, sizeof *w);
        assert_non_null(w);
        rng_fill_normal(w, U->numel, 0.3f, 7, (uint64_t)u, 0);
        k_copy_h2d(c, U->master, w, U->shard * sizeof *w);
        free(w);
    }
}

/* A step over rows given by positions (NULL: unpacked), their document bounds computed as
 * a batch of them is made. */
static fsdp_step_result step(fsdp *f, const int32_t *ids, const int32_t *labels,
                             const int32_t *positions, int rows) {
    fsdp_hparams hp = {.lr = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_step_result res;
    errbuf err = {{0}};
    int32_t start[DOCS * T], end[DOCS * T];
    assert_true(rows <= DOCS);
    fsdp_batch b = {.input_ids = ids, .labels = labels, .doc_start = positions ? start : NULL,
                    .doc_end = positions ? end : NULL, .n_micro = 1, .micro_batch = rows, .T = T};
    if ((positions && llama_doc_bounds(positions, rows, T, start, end, &err)) ||
        fsdp_train_step(f, &b, &hp, &res, &err))
        fail_msg("%s", err.msg);
    return res;
}

static void test_packed_step_equals_documents(void **state) {
    (void)state;
    llama_config cfg = tiny_config();
    kctx c;
    fsdp f;
    init_fsdp(&f, &c, &cfg);
    int32_t ids[ROWS * T], labels[ROWS * T], positions[ROWS * T];
    int32_t doc_ids[DOCS * T], doc_labels[DOCS * T];
    int n = 0;
    for (int b = 0; b < ROWS; b++)
        for (int d = 0, t = 0; lens[b][d]; t += lens[b][d++], n++)
            for (int i = 0; i < T; i++) {
                int at = b * T + t + i, in_doc = i < lens[b][d];
                if (in_doc) {
                    ids[at] = (int32_t)(rng_u64(3, 1, (uint64_t)at) % (uint64_t)cfg.vocab_size);
                    labels[at] = i == 0 ? K_IGNORE_INDEX : ids[at]; /* the data side's -100 */
                    positions[at] = i;
                }
                doc_ids[n * T + i] = in_doc ? ids[at] : 0;
                doc_labels[n * T + i] = in_doc ? labels[at] : K_IGNORE_INDEX;
            }
    assert_int_equal(n, DOCS);
    fsdp_step_result packed = step(&f, ids, labels, positions, ROWS);
    fsdp_step_result alone = step(&f, doc_ids, doc_labels, NULL, DOCS);
    printf("packed step: loss %.7f vs %.7f, grad norm %.7f vs %.7f, %lld targets\n",
           packed.loss, alone.loss, packed.grad_norm, alone.grad_norm,
           (long long)packed.tokens);
    assert_int_equal(packed.tokens, alone.tokens);
    assert_int_equal(packed.tokens, ROWS * T - DOCS); /* every token but documents' first */
    assert_true(fabs(packed.loss - alone.loss) <= 1e-5 * alone.loss);
    assert_true(fabs(packed.grad_norm - alone.grad_norm) <= 1e-5 * alone.grad_norm);

    /* the same rows unpacked (positions NULL) attend across the documents: another loss */
    fsdp_step_result crossing = step(&f, ids, labels, NULL, ROWS);
    assert_true(fabs(crossing.loss - alone.loss) > 1e-3 * alone.loss);

    /* positions that neither restart nor count up are refused, naming the place, and so
     * are bounds that do not tile a row */
    errbuf err = {{0}};
    fsdp_hparams hp = {.lr = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_step_result res;
    int32_t start[ROWS * T], end[ROWS * T];
    assert_int_equal(llama_doc_bounds(positions, ROWS, T, start, end, &err), 0);
    positions[T + 4] = 9;
    assert_int_equal(llama_doc_bounds(positions, ROWS, T, start, end, &err), -1);
    assert_non_null(strstr(err.msg, "positions[1,4] = 9"));
    start[T + 4] = 9;
    fsdp_batch b = {.input_ids = ids, .labels = labels, .doc_start = start, .doc_end = end,
                    .n_micro = 1, .micro_batch = ROWS, .T = T};
    assert_int_equal(fsdp_train_step(&f, &b, &hp, &res, &err), -1);
    assert_non_null(strstr(err.msg, "of token [1,4] do not tile the row"));
    fsdp_destroy(&f);
    kctx_destroy(&c);
}

/* ---- gradient accumulation ---- */

/* One step (lr 0: the model stays) over rows split into n_micro micro-batches of rows / n_micro. */
static fsdp_step_result split_step(fsdp *f, const int32_t *ids, const int32_t *labels, int rows, int n_micro) {
    fsdp_hparams hp = {.lr = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_step_result res;
    errbuf err = {{0}};
    fsdp_batch b = {.input_ids = ids, .labels = labels, .n_micro = n_micro, .micro_batch = rows / n_micro, .T = T};
    if (fsdp_train_step(f, &b, &hp, &res, &err)) fail_msg("%s", err.msg);
    return res;
}

/* Loss normalisation over micro-batches (DESIGN.md, Numerics): a step's loss and gradient are
 * those of the sum of token losses over every unmasked target of the whole batch divided by
 * their count, however the batch is split.  Rows with very different target counts: 1 x 4,
 * 2 x 2 and 4 x 1 micro-batches give one loss and gradient norm, the loss is the rows' loss
 * sums (each row evaluated alone) over their summed counts, and four micro-batches of one
 * same row give that row's own gradient (a mean, not a sum, of the micro-batches). */
static void test_grad_accum_normalised(void **state) {
    (void)state;
    enum { R = 4 };
    static const int masked[R] = {0, 9, 14, 3}; /* leading labels masked: 15, 7, 2, 13 targets */
    llama_config cfg = tiny_config();
    kctx c;
    fsdp f;
    init_fsdp(&f, &c, &cfg);
    int32_t ids[R * T], labels[R * T];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < T; i++) {
            ids[r * T + i] = (int32_t)(rng_u64(9, (uint64_t)r, (uint64_t)i) % (uint64_t)cfg.vocab_size);
            labels[r * T + i] = i < masked[r] ? K_IGNORE_INDEX : ids[r * T + i];
        }
    /* each row alone: its loss sum and target count */
    double sum = 0;
    int64_t count = 0;
    for (int r = 0; r < R; r++) {
        double s;
        int64_t n;
        errbuf err = {{0}};
        fsdp_batch b = {.input_ids = ids + r * T, .labels = labels + r * T, .n_micro = 1, .micro_batch = 1, .T = T};
        if (fsdp_eval_loss(&f, &b, &s, &n, &err)) fail_msg("%s", err.msg);
        assert_int_equal(n, T - 1 - (masked[r] > 0 ? masked[r] - 1 : 0));
        sum += s;
        count += n;
    }
    fsdp_step_result one = split_step(&f, ids, labels, R, 1), two = split_step(&f, ids, labels, R, 2),
                     four = split_step(&f, ids, labels, R, R);
    printf("grad accumulation: loss %.7f / %.7f / %.7f (rows: %.7f), grad norm %.7f / %.7f / %.7f\n", one.loss,
           two.loss, four.loss, sum / (double)count, one.grad_norm, two.grad_norm, four.grad_norm);
    const fsdp_step_result *splits[] = {&one, &two, &four};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(splits[i]->tokens, count);
        assert_true(fabs(splits[i]->loss - sum / (double)count) <= 1e-5 * fabs(sum / (double)count));
        assert_true(fabs(splits[i]->grad_norm - one.grad_norm) <= 1e-5 * one.grad_norm);
    }
    /* row 1 four times over, one a micro-batch: row 1's own loss and gradient */
    int32_t same_ids[R * T], same_labels[R * T];
    for (int r = 0; r < R; r++) {
        memcpy(same_ids + r * T, ids + T, T * sizeof *ids);
        memcpy(same_labels + r * T, labels + T, T * sizeof *labels);
    }
    fsdp_step_result alone = split_step(&f, ids + T, labels + T, 1, 1), repeated = split_step(&f, same_ids, same_labels, R, R);
    assert_int_equal(repeated.tokens, R * alone.tokens);
    assert_true(fabs(repeated.loss - alone.loss) <= 1e-5 * alone.loss);
    assert_true(fabs(repeated.grad_norm - alone.grad_norm) <= 1e-5 * alone.grad_norm);
    fsdp_destroy(&f);
    kctx_destroy(&c);
}

/* A long packed row (F46): one row of LONG_T = 4096 tokens holding 13 documents of 1 to
 * 1500 tokens (one across the head's 2048-row chunk boundary), on a yarn model whose 1024
 * positions its scaling stretches to 4096 (the worker's batch check admits it): each
 * document's loss in the row (the row with only that document's labels) is its loss alone
 * (a row of its own length, unpacked), and the documents' sum is the row's. */
enum { LONG_T = 4096, LONG_DOCS = 13 };
static const int long_lens[LONG_DOCS] = {1, 7, 100, 513, 1500, 2, 64, 900, 31, 250, 600, 127, 1};

static double eval_row(fsdp *f, const int32_t *ids, const int32_t *labels, const int32_t *start,
                       const int32_t *end, int T_row, int64_t *count) {
    fsdp_batch b = {.input_ids = ids, .labels = labels, .doc_start = start, .doc_end = end, .n_micro = 1,
                    .micro_batch = 1, .T = T_row};
    double sum;
    errbuf err = {{0}};
    if (fsdp_eval_loss(f, &b, &sum, count, &err)) fail_msg("%s", err.msg);
    return sum;
}

static void test_long_packed_row_documents(void **state) {
    (void)state;
    llama_config cfg = tiny_config();
    cfg.max_position_embeddings = 1024;
    cfg.rope = (rope_config){.type = ROPE_YARN, .theta = 100.0, .factor = 4.0, .original_max_position_embeddings = 1024,
                             .beta_fast = 32, .beta_slow = 1, .truncate = 1};
    assert_int_equal(llama_config_max_positions(&cfg), LONG_T);
    kctx c;
    fsdp f;
    init_fsdp(&f, &c, &cfg);
    static int32_t ids[LONG_T], labels[LONG_T], only[LONG_T], positions[LONG_T], start[LONG_T], end[LONG_T];
    int at[LONG_DOCS + 1] = {0};
    for (int d = 0; d < LONG_DOCS; d++) at[d + 1] = at[d] + long_lens[d];
    assert_int_equal(at[LONG_DOCS], LONG_T);
    for (int d = 0; d < LONG_DOCS; d++)
        for (int i = 0; i < long_lens[d]; i++) {
            int t = at[d] + i;
            ids[t] = (int32_t)(rng_u64(13, 2, (uint64_t)t) % (uint64_t)cfg.vocab_size);
            labels[t] = i == 0 ? K_IGNORE_INDEX : ids[t];
            positions[t] = i;
        }
    errbuf err = {{0}};
    if (llama_doc_bounds(positions, 1, LONG_T, start, end, &err)) fail_msg("%s", err.msg);
    int64_t n_row, n;
    double row = eval_row(&f, ids, labels, start, end, LONG_T, &n_row), sum = 0, worst = 0;
    assert_int_equal(n_row, LONG_T - LONG_DOCS);
    for (int d = 0; d < LONG_DOCS; d++) {
        for (int t = 0; t < LONG_T; t++) only[t] = t >= at[d] && t < at[d + 1] ? labels[t] : K_IGNORE_INDEX;
        int64_t n_in;
        double in_row = eval_row(&f, ids, only, start, end, LONG_T, &n_in);
        double alone = eval_row(&f, ids + at[d], labels + at[d], NULL, NULL, long_lens[d], &n);
        assert_int_equal(n_in, long_lens[d] - 1);
        assert_int_equal(n, n_in);
        double rel = alone ? fabs(in_row - alone) / fabs(alone) : fabs(in_row);
        if (rel > 1e-5) fail_msg("document %d (%d tokens from %d): %.9g in the row, %.9g alone", d, long_lens[d],
                                 at[d], in_row, alone);
        worst = rel > worst ? rel : worst;
        sum += in_row;
    }
    printf("a packed row of %d tokens, %d documents: each one's loss as alone (worst rel %.2e), the row's sum "
           "%.6f vs the documents' %.6f\n", LONG_T, LONG_DOCS, worst, row, sum);
    assert_true(fabs(row - sum) <= 1e-5 * fabs(row));
    /* unpacked (no bounds) the documents see each other and the positions run on: another loss */
    int64_t n_cross;
    double crossing = eval_row(&f, ids, labels, NULL, NULL, LONG_T, &n_cross);
    printf("the same row unpacked: %.6f\n", crossing);
    assert_true(fabs(crossing - row) > 1e-4 * fabs(row));
    fsdp_destroy(&f);
    kctx_destroy(&c);
}

/* ---- CPU offload ---- */

enum { STEPS = 3, OFF_ROWS = 4 };

typedef struct offload_run {
    double loss[STEPS], norm[STEPS], eval;
    float *state; /* every unit's master, m, v after the steps */
    size_t n, in_use; /* elements of state; context memory in use after the steps */
    long forwards;    /* fsdp's layer_forwards */
} offload_run;

/* A random fp32 model image of cfg (*bytes), and its parameter count (one rank: no padding). */
static void *random_image(const llama_config *cfg, size_t *bytes, size_t *params) {
    llama_layout lo;
    errbuf err = {{0}};
    if (llama_layout_init(&lo, cfg, &err)) fail_msg("%s", err.msg);
    *bytes = model_image_bytes(&lo, MODEL_IMAGE_F32);
    void *image = calloc(1, *bytes);
    assert_non_null(image);
    if (model_image_fill_random(image, &lo, MODEL_IMAGE_F32, 11, NULL, NULL, &err)) fail_msg("%s", err.msg);
    *params = 0;
    for (int u = 0; u < lo.n_units; u++) *params += lo.units[u].numel;
    llama_layout_free(&lo);
    return image;
}

/* STEPS steps of two micro-batches from the image, with weight decay, clipping (a small
 * clip_norm: every step is clipped) and an evaluation after the first.  The copy stream's
 * copies run as late as a GPU may run them (k_cpu_defer_copies): a missing wait or a buffer
 * reused too soon (offload_params' slots, offload_activations' ring) changes the bits. */
static void run_offloaded(const llama_config *cfg, const void *image, size_t bytes,
                          const fsdp_options *opt, offload_run *r) {
    kctx c;
    fsdp f;
    errbuf err = {{0}};
    if (kctx_init(&c, K_CPU, 0, &err) || k_cpu_defer_copies(&c, &err) || fsdp_init(&f, cfg, &c, NULL, 0, 1, opt, &err) ||
        fsdp_load_image(&f, image, bytes, &err))
        fail_msg("%s", err.msg);
    int32_t ids[OFF_ROWS * T], labels[OFF_ROWS * T];
    fsdp_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                       .clip_norm = 0.05};
    fsdp_batch b = {.input_ids = ids, .labels = labels, .n_micro = 2, .micro_batch = OFF_ROWS / 2, .T = T};
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < OFF_ROWS * T; i++)
            ids[i] = labels[i] = (int32_t)(rng_u64(5, (uint64_t)s, (uint64_t)i) % (uint64_t)cfg->vocab_size);
        fsdp_step_result res;
        if (fsdp_train_step(&f, &b, &hp, &res, &err)) fail_msg("%s", err.msg);
        r->loss[s] = res.loss;
        r->norm[s] = res.grad_norm;
        int64_t count;
        if (s == 0 && fsdp_eval_loss(&f, &b, &r->eval, &count, &err)) fail_msg("%s", err.msg);
    }
    if (fsdp_wait_optimizer(&f, &err)) fail_msg("%s", err.msg);
    r->n = 0;
    for (int u = 0; u < f.n_train; u++) r->n += 3 * f.units[u].shard;
    r->state = calloc(r->n, sizeof *r->state);
    assert_non_null(r->state);
    float *at = r->state;
    for (int u = 0; u < f.n_train; u++) { /* CPU backend: context memory is host memory */
        const fsdp_unit *U = &f.units[u];
        const float *kinds[3] = {U->master, U->m, U->v};
        for (int k = 0; k < 3; k++, at += U->shard) memcpy(at, kinds[k], U->shard * sizeof *at);
        /* compute copies: the master's cast, fp32 on the CPU (its bits) */
        if (opt->compute_copies) assert_memory_equal(U->copy, U->master, U->shard * sizeof *U->master);
    }
    r->in_use = k_bytes_in_use(&c);
    r->forwards = f.layer_forwards;
    fsdp_destroy(&f);
    kctx_destroy(&c);
}

/* fsdp.cpu_offload (AdamW on the host threads, the compute copies uploaded) and with
 * offload_params (gathers from the host copy) give the bits of the run on the device, and
 * keep exactly the state they move out of context memory. */
static void test_cpu_offload_same_bits(void **state) {
    (void)state;
    llama_config cfg = tiny_config();
    cfg.initializer_range = 0.3;
    size_t bytes, params;
    void *image = random_image(&cfg, &bytes, &params);

    fsdp_options none = {.sharding = JOB_SHARD_FULL};
    fsdp_options offload = {.sharding = JOB_SHARD_FULL, .cpu_offload = 1, .offload_threads = 3};
    fsdp_options streamed = offload;
    streamed.offload_params = 1;
    offload_run a, b, c;
    run_offloaded(&cfg, image, bytes, &none, &a);
    run_offloaded(&cfg, image, bytes, &offload, &b);
    run_offloaded(&cfg, image, bytes, &streamed, &c);
    for (int s = 0; s < STEPS; s++) {
        printf("step %d: loss %.7f, grad norm %.7f; offloaded %.7f, %.7f\n", s + 1, a.loss[s],
               a.norm[s], b.loss[s], b.norm[s]);
        assert_true(a.loss[s] == b.loss[s] && a.loss[s] == c.loss[s]);
        assert_true(a.norm[s] == b.norm[s] && a.norm[s] == c.norm[s]);
        assert_true(a.norm[s] > 0.05); /* clipped */
    }
    assert_true(a.loss[STEPS - 1] != a.loss[0]); /* the steps changed the model */
    assert_true(a.eval == b.eval && a.eval == c.eval);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.state, b.state, a.n * sizeof *a.state);
    assert_memory_equal(a.state, c.state, a.n * sizeof *a.state);
    /* context memory: master, m, v (12 bytes a parameter) left, and with offload_params the
     * compute copy (4 on the CPU) too; the gradients stay */
    assert_int_equal(a.in_use - b.in_use, 8 * params);
    assert_int_equal(a.in_use - c.in_use, 12 * params);
    free(a.state);
    free(b.state);
    free(c.state);
    free(image);
}

/* Compute copies (AdamW writing the compute dtype's weights in its pass, the forward and
 * backward reading them in place) give the bits of the casts at each gather: losses, gradient
 * norms, the evaluation and the state; the copies are the masters' cast (the CPU's compute
 * dtype is fp32: the masters' bits); context memory holds the copies (4 bytes a parameter
 * here) and no gather slots (two of the largest unit). */
static void test_compute_copies_same_bits(void **state) {
    (void)state;
    llama_config cfg = tiny_config();
    cfg.initializer_range = 0.3;
    size_t bytes, params;
    void *image = random_image(&cfg, &bytes, &params);
    fsdp_options cast = {.sharding = JOB_SHARD_FULL}, copies = {.sharding = JOB_SHARD_FULL, .compute_copies = 1};
    offload_run a, b;
    run_offloaded(&cfg, image, bytes, &cast, &a);
    run_offloaded(&cfg, image, bytes, &copies, &b);
    for (int s = 0; s < STEPS; s++) {
        printf("step %d: loss %.7f, grad norm %.7f; with copies %.7f, %.7f\n", s + 1, a.loss[s], a.norm[s], b.loss[s],
               b.norm[s]);
        assert_true(a.loss[s] == b.loss[s] && a.norm[s] == b.norm[s]);
    }
    assert_true(a.loss[STEPS - 1] != a.loss[0]); /* the steps changed the model */
    assert_true(a.eval == b.eval);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.state, b.state, a.n * sizeof *a.state);
    size_t largest = 0;
    llama_layout lo;
    errbuf err = {{0}};
    if (llama_layout_init(&lo, &cfg, &err)) fail_msg("%s", err.msg);
    for (int u = 0; u < lo.n_units; u++) largest = lo.units[u].numel > largest ? lo.units[u].numel : largest;
    llama_layout_free(&lo);
    assert_int_equal(b.in_use - a.in_use, 4 * params - 2 * 4 * largest);
    free(a.state);
    free(b.state);
    free(image);
}

/* ---- FP8 (train.precision fp8, F45) ---- */

/* One step (lr 0) of two micro-batches from the image: every trained unit's gradient,
 * into grads[u] (allocated), the step's loss in *loss. */
static void step_gradients(const llama_config *cfg, const void *image, size_t bytes, const fsdp_options *opt,
                           float **grads, size_t *shard, double *loss) {
    kctx c;
    fsdp f;
    errbuf err = {{0}};
    if (kctx_init(&c, K_CPU, 0, &err) || fsdp_init(&f, cfg, &c, NULL, 0, 1, opt, &err) ||
        fsdp_load_image(&f, image, bytes, &err))
        fail_msg("%s", err.msg);
    int32_t ids[OFF_ROWS * T], labels[OFF_ROWS * T];
    for (int i = 0; i < OFF_ROWS * T; i++)
        ids[i] = labels[i] = (int32_t)(rng_u64(5, 0, (uint64_t)i) % (uint64_t)cfg->vocab_size);
    fsdp_hparams hp = {.lr = 0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_batch b = {.input_ids = ids, .labels = labels, .n_micro = 2, .micro_batch = OFF_ROWS / 2, .T = T};
    fsdp_step_result res;
    if (fsdp_train_step(&f, &b, &hp, &res, &err)) fail_msg("%s", err.msg);
    *loss = res.loss;
    for (int u = 0; u < f.n_train; u++) {
        shard[u] = f.units[u].shard;
        grads[u] = malloc(shard[u] * sizeof *grads[u]);
        assert_non_null(grads[u]);
        memcpy(grads[u], f.units[u].grad, shard[u] * sizeof *grads[u]); /* CPU: host memory */
    }
    fsdp_destroy(&f);
    kctx_destroy(&c);
}

static double rel_l2(const float *x, const float *y, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d += (x[i] - y[i]) * (double)(x[i] - y[i]), s += (double)y[i] * y[i];
    return sqrt(d / s);
}

/* The middle layers' projections in FP8 (e4m3: 3 mantissa bits, a rounding of up to 2^-4 of
 * each operand; tensorwise or rowwise scales) on 4 layers of a Llama-like init (0.02):
 *  - one step's gradients, unit by unit, within 5e-2 of fp32's (FP8's rounding; a wrong
 *    operand layout, transpose or scale is off by the gradient itself), but not equal, and
 *    the loss within 1e-3;
 *  - three steps' losses within 2e-3 and gradient norms within 1e-2, the eval loss too;
 *  - context memory holds llama_fp8's buffers more.
 * A model with no middle layer is refused. */
static void test_fp8_linears(void **state) {
    (void)state;
    llama_config cfg = tiny_config();
    cfg.initializer_range = 0.02;
    cfg.num_hidden_layers = 4;
    size_t bytes, params;
    void *image = random_image(&cfg, &bytes, &params);
    fsdp_options none = {.sharding = JOB_SHARD_FULL};
    fsdp_options tensorwise = {.sharding = JOB_SHARD_FULL, .fp8 = 1, .fp8_scaling = K_FP8_TENSORWISE,
                               .fp8_grad_format = FP8_E4M3};
    fsdp_options rowwise = tensorwise, e5m2 = tensorwise;
    rowwise.fp8_scaling = K_FP8_ROWWISE;
    e5m2.fp8_grad_format = FP8_E5M2; /* train.fp8_grad_format */
    offload_run a, t, r, e;
    run_offloaded(&cfg, image, bytes, &none, &a);
    run_offloaded(&cfg, image, bytes, &tensorwise, &t);
    run_offloaded(&cfg, image, bytes, &rowwise, &r);
    run_offloaded(&cfg, image, bytes, &e5m2, &e);
    const offload_run *fp8[] = {&t, &r, &e};
    static const char *const names[] = {"tensorwise", "rowwise", "tensorwise, e5m2 gradients"};
    for (int k = 0; k < 3; k++)
        for (int s = 0; s < STEPS; s++) {
            const offload_run *x = fp8[k];
            printf("%s step %d: loss %.7f (fp32 %.7f), grad norm %.7f (%.7f)\n", names[k], s + 1,
                   x->loss[s], a.loss[s], x->norm[s], a.norm[s]);
            assert_true(x->loss[s] != a.loss[s]);
            assert_true(fabs(x->loss[s] - a.loss[s]) <= 2e-3 * a.loss[s]);
            assert_true(fabs(x->norm[s] - a.norm[s]) <= 1e-2 * a.norm[s]);
        }
    enum { UNITS = 6 };
    float *g32[UNITS], *g8[UNITS];
    size_t shard[UNITS];
    double l32, l8;
    step_gradients(&cfg, image, bytes, &none, g32, shard, &l32);
    for (int k = 0; k < 2; k++) {
        step_gradients(&cfg, image, bytes, k ? &rowwise : &tensorwise, g8, shard, &l8);
        assert_true(l8 != l32 && fabs(l8 - l32) <= 1e-3 * l32);
        for (int u = 0; u < UNITS; u++) {
            double e = rel_l2(g8[u], g32[u], shard[u]);
            printf("%s, one step: unit %d's gradient off fp32's by %.2e\n", k ? "rowwise" : "tensorwise", u, e);
            assert_true(e > 0 && e <= 5e-2);
            free(g8[u]);
        }
    }
    for (int u = 0; u < UNITS; u++) free(g32[u]);
    assert_true(t.loss[1] != r.loss[1]);
    /* the gradients' format: the first forward is e4m3's, the first update is not */
    assert_true(e.loss[0] == t.loss[0] && e.loss[1] != t.loss[1] && e.norm[0] != t.norm[0]);
    free(e.state);
    assert_true(t.eval != a.eval && fabs(t.eval - a.eval) <= 1e-2 * a.eval);
    llama_layout lo;
    llama_fp8 f8;
    errbuf err = {{0}};
    if (llama_layout_init(&lo, &cfg, &err)) fail_msg("%s", err.msg);
    size_t fp8_bytes = llama_fp8_carve(&f8, NULL, &lo, sizeof(float), OFF_ROWS / 2, T, 0);
    llama_layout_free(&lo);
    assert_int_equal(t.in_use - a.in_use, (fp8_bytes + 255) / 256 * 256);
    /* the layers gathered as codes (fp8_all_gather): the bits of the cast at each GEMM, with
     * shard_grad_op's kept slots too; the amaxes and scales of the two FP8 layers beside */
    fsdp_options gathered = tensorwise;
    gathered.fp8_all_gather = 1;
    for (int kept = 0; kept < 2; kept++) {
        offload_run g, want;
        gathered.sharding = tensorwise.sharding = kept ? JOB_SHARD_GRAD_OP : JOB_SHARD_FULL;
        run_offloaded(&cfg, image, bytes, &gathered, &g);
        if (kept) run_offloaded(&cfg, image, bytes, &tensorwise, &want);
        const offload_run *w = kept ? &want : &t;
        for (int s = 0; s < STEPS; s++) {
            assert_true(g.loss[s] == w->loss[s]);
            assert_true(g.norm[s] == w->norm[s]);
        }
        assert_true(g.eval == w->eval);
        assert_int_equal(g.n, w->n);
        assert_memory_equal(g.state, w->state, g.n * sizeof *g.state);
        assert_int_equal(g.in_use - w->in_use, (2 + (LLAMA_FP8_SCALE_STRIDE + 1) * 2 * LLAMA_FP8_PROJECTIONS) * sizeof(float));
        free(g.state);
        if (kept) free(want.state);
    }
    tensorwise.sharding = JOB_SHARD_FULL;
    gathered.fp8_scaling = K_FP8_ROWWISE;
    kctx c;
    fsdp f;
    if (kctx_init(&c, K_CPU, 0, &err)) fail_msg("%s", err.msg);
    assert_int_equal(fsdp_init(&f, &cfg, &c, NULL, 0, 1, &gathered, &err), -1);
    assert_non_null(strstr(err.msg, "train.fp8_all_gather with rowwise scales is not built yet"));
    fsdp_destroy(&f);
    free(a.state), free(t.state), free(r.state);
    free(image);

    cfg.num_hidden_layers = 2;
    assert_int_equal(fsdp_init(&f, &cfg, &c, NULL, 0, 1, &tensorwise, &err), -1);
    assert_non_null(strstr(err.msg, "a model of 2 layers has none to run in FP8"));
    fsdp_destroy(&f);
    kctx_destroy(&c);
}

/* ---- activation checkpointing ---- */

/* Every activation checkpointing gives the bits of none (losses, norms, evaluation, master,
 * m and v), on 4 layers: full and selective recompute 3 a micro-batch (the last layer's
 * activations are still in place), 1 whole layer and the others' attention 2, 2 whole and
 * the others' inputs 1; and with cpu_offload as without; and full recompute with 1, 2 or 3
 * layer inputs offloaded (fsdp.offload_activations: the ring of two device buffers and the
 * host copies), holding one device buffer of a layer input less for each. */
static void test_recompute_same_bits(void **state) {
    (void)state;
    llama_config cfg = tiny_config();
    cfg.initializer_range = 0.3;
    cfg.num_hidden_layers = 4;
    size_t bytes, params;
    void *image = random_image(&cfg, &bytes, &params);
    static const struct {
        llama_recompute r;
        long recomputed; /* a micro-batch */
        int cpu_offload, offload_layers;
    } cases[] = {{{4, LLAMA_KEEP_INPUT}, 3, 0, 0},     {{4, LLAMA_KEEP_ATTENTION}, 3, 0, 0},
                 {{3, LLAMA_KEEP_ATTENTION}, 2, 0, 0}, {{2, LLAMA_KEEP_INPUT}, 1, 0, 0},
                 {{4, LLAMA_KEEP_ATTENTION}, 3, 1, 0}, {{4, LLAMA_KEEP_INPUT}, 3, 0, 1},
                 {{4, LLAMA_KEEP_INPUT}, 3, 0, 2},     {{4, LLAMA_KEEP_INPUT}, 3, 1, 3},
                 {{4, LLAMA_KEEP_RESIDUAL}, 3, 0, 0},  {{2, LLAMA_KEEP_RESIDUAL}, 1, 0, 0},
                 {{4, LLAMA_KEEP_CONTEXT}, 3, 0, 0},   {{3, LLAMA_KEEP_CONTEXT}, 2, 0, 0}};
    size_t input_bytes = (size_t)OFF_ROWS / 2 * T * cfg.hidden_size * sizeof(float), full_in_use = 0;
    size_t selective_in_use = 0, residual_in_use = 0;
    fsdp_options none = {.sharding = JOB_SHARD_FULL, .offload_threads = 2};
    offload_run a, b;
    run_offloaded(&cfg, image, bytes, &none, &a);
    long micro = STEPS * 2, eval_micro = 2; /* two micro-batches a step, and the evaluation's
                                             * (its forward alone: nothing recomputed) */
    assert_int_equal(a.forwards, 4 * (micro + eval_micro));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fsdp_options opt = none;
        opt.recompute = cases[i].r;
        opt.cpu_offload = cases[i].cpu_offload;
        opt.offload_layers = cases[i].offload_layers;
        run_offloaded(&cfg, image, bytes, &opt, &b);
        printf("recomputed layers %d, keep %d, cpu_offload %d, %d layer inputs offloaded: losses %.7f %.7f %.7f, "
               "%ld layer forwards\n", cases[i].r.layers, (int)cases[i].r.keep, cases[i].cpu_offload,
               cases[i].offload_layers, b.loss[0], b.loss[1], b.loss[2], b.forwards);
        assert_memory_equal(a.loss, b.loss, sizeof a.loss);
        assert_memory_equal(a.norm, b.norm, sizeof a.norm);
        assert_true(a.eval == b.eval);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.state, b.state, a.n * sizeof *a.state);
        assert_int_equal(b.forwards, a.forwards + cases[i].recomputed * micro);
        if (!cases[i].cpu_offload) assert_true(b.in_use < a.in_use); /* fewer activations kept */
        if (i == 0) full_in_use = b.in_use;
        if (i == 1) selective_in_use = b.in_use;
        /* h kept: a layer input's bytes (h's) more than full recompute for each of the 3
         * layers recomputed, less than selective */
        if (i == 8) {
            assert_int_equal(b.in_use, full_in_use + 3 * input_bytes);
            assert_true(b.in_use < selective_in_use);
            residual_in_use = b.in_use;
        }
        /* the attention's output kept too: more than h alone, less than selective */
        if (i == 10) assert_true(residual_in_use < b.in_use && b.in_use < selective_in_use);
        if (cases[i].offload_layers && !cases[i].cpu_offload)
            assert_int_equal(b.in_use, full_in_use - cases[i].offload_layers * input_bytes);
        free(b.state);
    }
    free(a.state);
    free(image);
}

/* The largest relative difference of a[n] and b[n]. */
/* max |a - b| over max |a|: the difference against the state's scale (an element near zero
 * after Adam's steps, 5e-4 where the masters are 0.3, differs by a few ulps of the large ones:
 * against itself, relative to a 1e-3 floor, it failed on one machine's BLAS). */
static double max_scaled_diff(const float *a, const float *b, size_t n) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        worst = d > worst ? d : worst;
        scale = fabs((double)a[i]) > scale ? fabs((double)a[i]) : scale;
    }
    return scale > 0 ? worst / scale : worst;
}

/* fsdp.mlp_chunk (F46): each layer's MLP in chunks of rows (forward, and backward recomputing
 * each chunk) against full recompute all at once, 2 micro-batches of 32 rows: chunks of 32 or
 * more are the unchunked run, bit for bit; chunks of 5 (the last of 2) and 7, under full and
 * selective recompute, with the inputs offloaded and with cpu_offload, split only the rows
 * of GEMMs and row-wise kernels, so the forward (the first step's loss, and the evaluation's
 * rows) is the same bits; the weights' gradients sum the chunks' partial products in
 * another order, so the later steps agree to fp32 rounding; the context memory holds
 * [chunk, intermediate] MLP buffers (gate, up, silu(gate) * up, and the scratch's gradient)
 * instead of [32, intermediate]. */
static void test_mlp_chunk(void **state) {
    (void)state;
    llama_config cfg = tiny_config();
    cfg.initializer_range = 0.3;
    cfg.num_hidden_layers = 4;
    size_t bytes, params;
    void *image = random_image(&cfg, &bytes, &params);
    static const struct {
        int chunk;
        llama_keep keep;
        int offload_layers, cpu_offload;
    } cases[] = {{32, LLAMA_KEEP_INPUT, 0, 0}, {100, LLAMA_KEEP_INPUT, 0, 0}, {5, LLAMA_KEEP_INPUT, 0, 0},
                 {7, LLAMA_KEEP_ATTENTION, 0, 0}, {5, LLAMA_KEEP_INPUT, 3, 0}, {7, LLAMA_KEEP_INPUT, 0, 1},
                 {5, LLAMA_KEEP_RESIDUAL, 0, 0}, {5, LLAMA_KEEP_CONTEXT, 0, 0}};
    fsdp_options whole = {.sharding = JOB_SHARD_FULL, .offload_threads = 2, .recompute = {4, LLAMA_KEEP_INPUT}};
    offload_run a, b;
    size_t rows = OFF_ROWS / 2 * T, I = (size_t)cfg.intermediate_size, cs = sizeof(float);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fsdp_options base = whole, opt = whole;
        base.recompute.keep = opt.recompute.keep = cases[i].keep;
        base.offload_layers = opt.offload_layers = cases[i].offload_layers;
        base.cpu_offload = opt.cpu_offload = cases[i].cpu_offload;
        opt.mlp_chunk = cases[i].chunk;
        run_offloaded(&cfg, image, bytes, &base, &a);
        run_offloaded(&cfg, image, bytes, &opt, &b);
        double state_rel = max_scaled_diff(a.state, b.state, a.n);
        printf("mlp_chunk %d, keep %d, %d inputs offloaded, cpu_offload %d: losses %.9f %.9f %.9f vs %.9f %.9f "
               "%.9f, state rel %.2e, context memory %zu -> %zu\n", cases[i].chunk, (int)cases[i].keep,
               cases[i].offload_layers, cases[i].cpu_offload, a.loss[0], a.loss[1], a.loss[2], b.loss[0], b.loss[1],
               b.loss[2], state_rel, a.in_use, b.in_use);
        assert_true(a.loss[0] == b.loss[0]);
        assert_int_equal(a.n, b.n);
        if (cases[i].chunk >= (int)rows) {
            assert_memory_equal(a.loss, b.loss, sizeof a.loss);
            assert_memory_equal(a.state, b.state, a.n * sizeof *a.state);
            assert_int_equal(a.in_use, b.in_use);
        } else {
            for (int s = 1; s < STEPS; s++) assert_true(fabs(a.loss[s] - b.loss[s]) <= 1e-5 * fabs(a.loss[s]));
            assert_true(state_rel <= 1e-4);
            if (!cases[i].cpu_offload) /* 3 shared [rows, I] buffers and the scratch's, 256-aligned */
                assert_int_equal(a.in_use - b.in_use, 4 * ((rows * I * cs + 255) / 256 * 256 -
                                                           ((size_t)cases[i].chunk * I * cs + 255) / 256 * 256));
        }
        free(a.state);
        free(b.state);
    }
    free(image);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_step_equals_documents),
        cmocka_unit_test(test_grad_accum_normalised),
        cmocka_unit_test(test_long_packed_row_documents),
        cmocka_unit_test(test_cpu_offload_same_bits),
        cmocka_unit_test(test_compute_copies_same_bits),
        cmocka_unit_test(test_fp8_linears),
        cmocka_unit_test(test_recompute_same_bits),
        cmocka_unit_test(test_mlp_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
