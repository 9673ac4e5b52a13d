/* bf16: bfloat16 and IEEE half <-> fp32, rounded to nearest even (NaN stays a quiet NaN;
 * f16 overflows to inf, underflows through subnormals to zero). */
#ifndef FSDP_BF16_H
#define FSDP_BF16_H

#include <stddef.h>
#include <stdint.h>

uint16_t bf16_from_f32(float f);
float bf16_to_f32(uint16_t h);
/* dst[i] = bf16_to_f32(src[i]) for i < n. */
void bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
uint16_t f16_from_f32(float f);
float f16_to_f32(uint16_t h);

#endif
