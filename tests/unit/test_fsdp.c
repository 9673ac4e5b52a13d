/* worker/fsdp: packed micro-batches through fsdp_train_step (one rank, CPU backend).
 *
 * A step over rows packed with documents (positions restarting at each) has the loss, the
 * target count and the gradient norm of a step over the same documents as rows of their
 * own, padded: the positions reach every layer's RoPE and attention (varlen), and the loss
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

static fsdp_step_result step(fsdp *f, const int32_t *ids, const int32_t *labels,
                             const int32_t *positions, int rows) {
    fsdp_hparams hp = {.lr = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_step_result res;
    errbuf err = {{0}};
    fsdp_batch b = {.input_ids = ids, .labels = labels, .positions = positions, .n_micro = 1,
                    .micro_batch = rows, .T = T};
    if (fsdp_train_step(f, &b, &hp, &res, &err))
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

    /* positions that neither restart nor count up are refused, naming the place */
    errbuf err = {{0}};
    fsdp_hparams hp = {.lr = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    fsdp_step_result res;
    positions[T + 4] = 9;
    fsdp_batch b = {.input_ids = ids, .labels = labels, .positions = positions, .n_micro = 1,
                    .micro_batch = ROWS, .T = T};
    assert_int_equal(fsdp_train_step(&f, &b, &hp, &res, &err), -1);
    assert_non_null(strstr(err.msg, "positions[1,4] = 9"));
    fsdp_destroy(&f);
    kctx_destroy(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_step_equals_documents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
