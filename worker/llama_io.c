/* llama_io: reading checkpoint tensors into the unit layout, checking a batch, RoPE
 * frequencies from the config. */
#include "worker/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The data pointer of a mapped tensor need not be aligned for its dtype: read through
 * memcpy. */
static void convert_to_f32(const st_tensor *t, float *dst) {
    const unsigned char *p = t->data;
    size_t n = t->numel, esize = st_dtype_size(t->dtype);
    if (t->dtype == ST_F32) {
        memcpy(dst, p, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++, p += esize) {
        if (t->dtype == ST_F64) {
            double d;
            memcpy(&d, p, sizeof d);
            dst[i] = (float)d;
        } else {
            uint16_t h;
            memcpy(&h, p, sizeof h);
            dst[i] = t->dtype == ST_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
        }
    }
}

int llama_read_tensor_f32(const llama_tensor_slot *slot, const st_model *st, float *dst,
                          errbuf *err) {
    const st_tensor *t = st_model_find(st, slot->name);
    if (!t) return errf(err, "%s: tensor %s is missing", st->dir, slot->name);
    int shape_ok = t->ndim == slot->ndim && t->shape[0] == slot->shape[0] &&
                   (slot->ndim == 1 || t->shape[1] == slot->shape[1]);
    if (!shape_ok) {
        char want[64], have[128] = "";
        if (slot->ndim == 1)
            snprintf(want, sizeof want, "[%lld]", (long long)slot->shape[0]);
        else
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)slot->shape[0],
                     (long long)slot->shape[1]);
        size_t len = 0;
        for (int d = 0; d < t->ndim && len < sizeof have - 24; d++)
            len += (size_t)snprintf(have + len, sizeof have - len, "%s%lld", d ? ", " : "",
                                    (long long)t->shape[d]);
        return errf(err, "%s: tensor %s has shape [%s], expected %s", st->dir, slot->name, have,
                    want);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64)
        return errf(err, "%s: tensor %s has dtype %s, expected a float type", st->dir,
                    slot->name, st_dtype_name(t->dtype));
    convert_to_f32(t, dst);
    return 0;
}

int llama_check_batch(const llama_config *cfg, const int32_t *input_ids, const int32_t *labels,
                      int B, int T, errbuf *err) {
    if (B <= 0 || T <= 0) return errf(err, "batch: shape [%d, %d] is empty", B, T);
    if (T > cfg->max_position_embeddings)
        return errf(err, "batch: sequence length %d exceeds max_position_embeddings %d", T,
                    cfg->max_position_embeddings);
    int V = cfg->vocab_size;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t id = input_ids[(size_t)b * T + t];
            if (id < 0 || id >= V)
                return errf(err, "batch: input_ids[%d,%d] = %d is not a token id in [0, %d)", b,
                            t, (int)id, V);
            if (!labels) continue;
            int32_t y = labels[(size_t)b * T + t];
            if (y != K_IGNORE_INDEX && (y < 0 || y >= V))
                return errf(err, "batch: labels[%d,%d] = %d is neither a token id in [0, %d) "
                                 "nor %d", b, t, (int)y, V, K_IGNORE_INDEX);
        }
    return 0;
}

void llama_rope_inv_freq(const llama_config *cfg, float *host_inv_freq) {
    const rope_config *r = &cfg->rope;
    k_rope_params p = {
        .theta = r->theta,
        .llama3 = r->type == ROPE_LLAMA3,
        .factor = r->factor,
        .low_freq_factor = r->low_freq_factor,
        .high_freq_factor = r->high_freq_factor,
        .original_max_position_embeddings = r->original_max_position_embeddings,
    };
    k_rope_inv_freq(&p, cfg->head_dim, host_inv_freq);
}
