/* fsdp_generate: generation through the sharded model (see fsdp_generate.h). */
#include "worker/fsdp_generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/bytes.h"
#include "model/llama_decode.h"

#define ALIGN 256 /* bytes: what CUDA allocations guarantee */

typedef struct sharded {
    fsdp *f;
    int rows, max_len, max_tokens;
    void *memory; /* the caches, then the pass's buffers */
    void **k_cache, **v_cache; /* [n_layers], each [rows, max_len, KV] */
    llama_decode_acts acts;
    void *resid[2];  /* [max_tokens, C] */
    int32_t *tokens; /* [max_tokens] */
    int32_t *pos;    /* [rows] */
    float *logits;   /* [rows, V] fp32 */
    void *merged;    /* LoRA: a decoder layer with its adapters merged [layer numel] */
} sharded;

static int sharded_init(sharded *d, fsdp *f, int rows, int max_len, int max_tokens, errbuf *err) {
    const llama_config *cfg = &f->layout.cfg;
    int L = f->layout.n_layers;
    size_t cs = k_compute_size(f->ctx), C = (size_t)cfg->hidden_size;
    size_t kv = (size_t)cfg->num_key_value_heads * cfg->head_dim;
    *d = (sharded){.f = f, .rows = rows, .max_len = max_len, .max_tokens = max_tokens};
    d->k_cache = calloc((size_t)L, sizeof *d->k_cache);
    d->v_cache = calloc((size_t)L, sizeof *d->v_cache);
    if (!d->k_cache || !d->v_cache) return errf(err, "out of host memory");
    size_t cache = round_up((size_t)rows * max_len * kv * cs, ALIGN);
    size_t acts = llama_decode_acts_carve(&d->acts, NULL, &f->layout, cs, max_tokens, rows);
    size_t resid = round_up((size_t)max_tokens * C * cs, ALIGN);
    size_t small = round_up((size_t)max_tokens * sizeof(int32_t), ALIGN);
    size_t logits = round_up((size_t)rows * cfg->vocab_size * sizeof(float), ALIGN);
    size_t merged = f->has_lora ? f->layout.units[llama_layer_unit(0)].numel * cs : 0;
    char *m = d->memory =
        k_alloc(f->ctx, 2 * (size_t)L * cache + acts + 2 * resid + 2 * small + logits + merged, err);
    if (!m) return -1;
    for (int l = 0; l < L; l++) {
        d->k_cache[l] = m + (2 * (size_t)l) * cache;
        d->v_cache[l] = m + (2 * (size_t)l + 1) * cache;
    }
    m += 2 * (size_t)L * cache;
    llama_decode_acts_carve(&d->acts, m, &f->layout, cs, max_tokens, rows);
    d->resid[0] = m + acts;
    d->resid[1] = m + acts + resid;
    d->tokens = (int32_t *)(m + acts + 2 * resid);
    d->pos = (int32_t *)(m + acts + 2 * resid + small);
    d->logits = (float *)(m + acts + 2 * resid + 2 * small);
    d->merged = merged ? m + acts + 2 * resid + 2 * small + logits : NULL;
    return 0;
}

static void sharded_destroy(sharded *d) {
    if (d->memory) k_free(d->f->ctx, d->memory);
    free(d->k_cache);
    free(d->v_cache);
}

/* A decoder layer's weights with its adapters merged, as PEFT's merge_and_unload: a copy of
 * the gathered base (which may be a frozen shard itself) in d->merged, each targeted W +=
 * (scale B) A (k_linear_bwd's din = dout W, with B scaled in its gathered copy). */
static const void *merge_adapters(sharded *d, const void *base, void *adapters) {
    fsdp *f = d->f;
    kctx *c = f->ctx;
    const llama_tensor_slot *t = &f->layout.tensors[f->layout.units[llama_layer_unit(0)].first];
    const lora_layout *ll = &f->lora_layout;
    size_t cs = k_compute_size(c), numel = f->layout.units[llama_layer_unit(0)].numel;
    int r = ll->cfg.rank;
    k_zero(c, d->merged, numel * cs);
    k_accumulate(c, d->merged, base, numel);
    for (int m = 0; m < LORA_MODULES; m++) {
        const lora_site *s = &ll->site[m];
        if (!s->on) continue;
        char *A = (char *)adapters + s->a_off * cs, *B = (char *)adapters + s->b_off * cs;
        k_scale(c, B, f->lora.scale, (size_t)s->out * r);
        k_linear_bwd(c, (char *)d->merged + t[m].offset * cs, NULL, B, NULL, A, s->out, s->in, r, 1);
    }
    return d->merged;
}

/* gen_model's forward: every unit gathered in turn, the new tokens run through it. */
static int sharded_forward(void *self, int row0, int B, int S, const int32_t *tokens,
                           const int32_t *pos, float *logits, errbuf *err) {
    sharded *d = self;
    fsdp *f = d->f;
    const llama_layout *lo = &f->layout;
    kctx *c = f->ctx;
    int L = lo->n_layers;
    if (row0 < 0 || B < 1 || S < 1 || row0 + B > d->rows || (size_t)B * S > (size_t)d->max_tokens)
        return errf(err, "samples: %d rows of %d tokens from row %d do not fit", B, S, row0);
    for (int b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] + S > d->max_len)
            return errf(err, "samples: row %d's %d new tokens at position %d pass its %d positions",
                        row0 + b, S, pos[b], d->max_len);
    size_t cs = k_compute_size(c), C = (size_t)lo->cfg.hidden_size, V = (size_t)lo->cfg.vocab_size;
    size_t row_cache = (size_t)row0 * d->max_len * lo->cfg.num_key_value_heads * lo->cfg.head_dim * cs;
    k_copy_h2d(c, d->tokens, tokens, (size_t)B * S * sizeof(int32_t));
    k_copy_h2d(c, d->pos, pos, (size_t)B * sizeof(int32_t));
    void *adapters;
    const void *p = fsdp_gather_unit(f, LLAMA_EMBED_UNIT, 0, &adapters, err);
    if (!p) return -1;
    llama_embed_forward(c, lo, p, d->tokens, d->resid[0], B * S);
    int at = 0;
    for (int l = 0; l < L; l++, at ^= 1) {
        if (!(p = fsdp_gather_unit(f, llama_layer_unit(l), (l + 1) % 2, &adapters, err))) return -1;
        if (adapters) p = merge_adapters(d, p, adapters);
        llama_layer_decode(c, lo, p, f->inv_freq, (char *)d->k_cache[l] + row_cache,
                           (char *)d->v_cache[l] + row_cache, d->pos, d->max_len, d->resid[at],
                           d->resid[at ^ 1], &d->acts, B, S);
    }
    const void *embed = NULL;
    if (lo->cfg.tie_word_embeddings && !(embed = fsdp_gather_unit(f, LLAMA_EMBED_UNIT, 2, &adapters, err)))
        return -1;
    const void *head = fsdp_gather_unit(f, llama_head_unit(lo), (L + 1) % 2, &adapters, err);
    if (!head) return -1;
    for (int b = 0; b < B; b++) /* each row's last new token */
        llama_head_logits(c, lo, head, embed, (char *)d->resid[at] + ((size_t)b * S + S - 1) * C * cs,
                          &d->acts, d->logits + (size_t)b * V, 1);
    if (f->world > 1 && (k_check(c, err) || comm_broadcast(f->comm, d->logits, (size_t)B * V, COMM_F32, 0, err)))
        return errprefix(err, "samples: the logits");
    k_copy_d2h(c, logits, d->logits, (size_t)B * V * sizeof(float));
    return k_sync(c, err);
}

int fsdp_generate(fsdp *f, const gen_prompt *prompts, int n, const gen_options *o,
                  gen_reply *replies, errbuf *err) {
    int longest = 1;
    for (int i = 0; i < n; i++)
        if (prompts[i].n > longest) longest = prompts[i].n;
    int max_pos = f->layout.cfg.max_position_embeddings;
    long want = (long)longest + o->max_new_tokens;
    int max_len = want < max_pos ? (int)want : max_pos;
    sharded d;
    int rc = sharded_init(&d, f, n, max_len, longest > n ? longest : n, err);
    if (rc == 0) {
        gen_model m = {.self = &d, .forward = sharded_forward, .vocab_size = f->layout.cfg.vocab_size,
                       .rows = n, .max_positions = max_len};
        rc = gen_run(&m, prompts, n, o, replies, err);
    }
    sharded_destroy(&d);
    return rc;
}
