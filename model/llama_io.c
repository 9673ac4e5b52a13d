/* llama_io: reading checkpoint tensors into the unit layout, checking a batch and its
 * document bounds, RoPE frequencies from the config. */
#include "model/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int llama_read_tensor_f32(const llama_tensor_slot *slot, const st_model *st, float *dst,
                          errbuf *err) {
    const st_tensor *t = llama_checkpoint_tensor(slot, st, err);
    return t ? st_read_f32(t, 0, slot->numel, dst, err) : -1;
}

int llama_check_batch(const llama_config *cfg, const int32_t *input_ids, const int32_t *labels,
                      int B, int T, errbuf *err) {
    if (B <= 0 || T <= 0) return errf(err, "batch: shape [%d, %d] is empty", B, T);
    if (llama_config_check_seq_len(cfg, "batch: sequence length", T, "the model", err)) return -1;
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

int llama_check_docs(const int32_t *start, const int32_t *end, int B, int T, errbuf *err) {
    for (int b = 0; b < B; b++) {
        const int32_t *s = start + (size_t)b * T, *e = end + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            int opens = s[t] == t; /* the token starts a document: the last one ended here */
            int ok = s[t] <= t && t < e[t] && e[t] <= T &&
                     (t == 0 ? opens
                             : opens ? e[t - 1] == t : s[t] == s[t - 1] && e[t] == e[t - 1]);
            if (!ok)
                return errf(err, "batch: document bounds [%d, %d) of token [%d,%d] do not tile "
                                 "the row (they must hold the token, lie within [0, %d) and be "
                                 "the previous token's unless a document starts at the token, "
                                 "where the previous one ends)", (int)s[t], (int)e[t], b, t, T);
        }
    }
    return 0;
}

int llama_doc_bounds(const int32_t *positions, int B, int T, int32_t *start, int32_t *end,
                     errbuf *err) {
    for (int b = 0; b < B; b++) {
        const int32_t *pos = positions + (size_t)b * T;
        int32_t *s = start + (size_t)b * T, *e = end + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            if (pos[t] != 0 && (t == 0 || pos[t] != pos[t - 1] + 1))
                return errf(err, "batch: positions[%d,%d] = %d is neither 0 (a document's "
                                 "start) nor the previous position + 1", b, t, (int)pos[t]);
            s[t] = t - pos[t];
        }
        /* a document ends where the next one starts, the last at T */
        for (int t = T - 1; t >= 0; t--) e[t] = t == T - 1 || pos[t + 1] == 0 ? t + 1 : e[t + 1];
    }
    return 0;
}

void llama_rope_inv_freq(const llama_config *cfg, float *host_inv_freq) {
    const rope_config *r = &cfg->rope;
    static const k_rope_kind kinds[] = {[ROPE_DEFAULT] = K_ROPE_DEFAULT,
                                        [ROPE_LLAMA3] = K_ROPE_LLAMA3,
                                        [ROPE_LINEAR] = K_ROPE_LINEAR,
                                        [ROPE_YARN] = K_ROPE_YARN};
    k_rope_params p = {
        .theta = r->theta,
        .kind = kinds[r->type],
        .factor = r->factor,
        .low_freq_factor = r->low_freq_factor,
        .high_freq_factor = r->high_freq_factor,
        .original_max_position_embeddings = r->original_max_position_embeddings,
        .beta_fast = r->beta_fast,
        .beta_slow = r->beta_slow,
        .truncate = r->truncate,
    };
    k_rope_inv_freq(&p, cfg->head_dim, host_inv_freq);
}
