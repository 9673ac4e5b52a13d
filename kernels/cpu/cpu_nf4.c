/* CPU backend: NF4 dequantization (QLoRA's frozen base weights), the fp32 reference. */
#include "kernels/cpu/cpu_kernels.h"

#include "base/nf4_tables.h"

static const float nf4_code[16] = NF4_CODE_VALUES;
static const float nf4_dynamic_map[256] = NF4_DYNAMIC_MAP_VALUES;

/* Block b's absmax; under double quantization two fp32 roundings (no fused multiply-add: C11
 * contracts nothing across statements), as bnb's dequantize_blockwise and then + offset. */
static float block_absmax(const void *absmax, const float *nested_absmax, float offset,
                          size_t b) {
    if (!nested_absmax) return ((const float *)absmax)[b];
    const uint8_t *q = absmax;
    float centred = nf4_dynamic_map[q[b]] * nested_absmax[b / NF4_NESTED_BLOCK];
    return centred + offset;
}

void cpu_nf4_dequant(kctx *c, void *out, const uint8_t *packed, const void *absmax,
                     const float *nested_absmax, float offset, size_t n) {
    (void)c;
    float *o = out;
    for (size_t b = 0, first = 0; first < n; b++, first += NF4_BLOCK) {
        float scale = block_absmax(absmax, nested_absmax, offset, b);
        size_t end = n - first < NF4_BLOCK ? n : first + NF4_BLOCK;
        for (size_t i = first; i < end; i++) {
            uint8_t code = i % 2 ? packed[i / 2] & 15 : packed[i / 2] >> 4;
            o[i] = nf4_code[code] * scale;
        }
    }
}
