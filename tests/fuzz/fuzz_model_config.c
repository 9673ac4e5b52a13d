/* libFuzzer target for llama_config_parse: any input must be rejected with a message or
 * give a config whose parameter list is consistent with its parameter count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llama_config c;
    errbuf err = {{0}};
    if (llama_config_parse(&c, (const char *)data, size, "fuzz.json", &err) < 0) {
        if (!err.msg[0]) abort(); /* a failure always says why */
        return 0;
    }
    if (c.head_dim <= 0 || c.num_attention_heads % c.num_key_value_heads) abort();
    /* Enumerate a bounded prefix; the count itself is computed for any size. */
    llama_param_info params[32];
    int n = llama_config_params(&c, params, 32);
    int per_layer = 9 + 3 * c.attention_bias + 2 * c.qk_norm; /* Qwen2's biases, Qwen3's norms */
    if (n != c.num_hidden_layers * per_layer + 2 + !c.tie_word_embeddings) abort();
    if (c.sliding_window < 0 || !(rope_attention_factor(&c.rope) > 0)) abort();
    for (int i = 0; i < n && i < 32; i++)
        if (!params[i].name[0] || params[i].shape[0] <= 0) abort();
    (void)llama_config_num_params(&c);
    return 0;
}
