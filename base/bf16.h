/* bf16: bfloat16 and IEEE half <-> fp32, rounded to nearest even (NaN stays a quiet NaN;
 * f16 overflows to inf, underflows through subnormals to zero). */
#ifndef FSDP_BF16_H
#define FSDP_BF16_H

#include <stdint.h>

uint16_t bf16_from_f32(float f);
float bf16_to_f32(uint16_t h);
uint16_t f16_from_f32(float f);
float f16_to_f32(uint16_t h);

#endif
