/* nf4: 4-bit NormalFloat quantization exactly as bitsandbytes 0.50 stores it (QLoRA's frozen
 * base, DESIGN.md "LoRA and QLoRA"), and the "-bnb-4bit" safetensors layout transformers saves.
 *
 * Quantization (bnb's CUDA kQuantizeBlockwise, NF4):
 *   - blocks of 64 values, restarting at each tensor; absmax = max |w| of the block (fp32);
 *   - each value is multiplied by the fp32 reciprocal 1/absmax and coded by bnb's decision
 *     tree (dQuantizeNF4): code c when x lies above the c-th of 15 fixed thresholds (the
 *     midpoints of the code table, as bnb's fp32 literals); NaN (an all-zero block: 0 * inf)
 *     codes 0;
 *   - two codes a byte, the first value in the high nibble; an odd count's last low nibble is
 *     7 (bnb pads the block with 0.0, whose code is 7).
 * Double quantization (compress_statistics): offset = mean(absmax) (fp32), then absmax -
 * offset quantized with the signed 8-bit dynamic map (create_dynamic_map()) in blocks of 256
 * with an fp32 nested absmax per block (dQuantize's binary search and midpoints).
 * Dequantization: code value * absmax in fp32 (absmax itself code * nested_absmax + offset
 * under double quantization), then rounded to the input's dtype (nearest even). */
#ifndef FSDP_NF4_H
#define FSDP_NF4_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errbuf.h"
#include "base/nf4_tables.h" /* NF4_BLOCK, NF4_NESTED_BLOCK, the tables' values */
#include "proto/safetensors.h"

extern const float nf4_code[16];         /* bnb's NF4 table (quant_map) */
extern const float nf4_dynamic_map[256]; /* bnb's create_dynamic_map(signed=True) (nested_quant_map) */

/* A quantized tensor.  absmax (single quantization) or absmax_q + nested_absmax + offset
 * (double quantization) are set. */
typedef struct nf4_tensor {
    st_dtype dtype; /* the input's: F32, BF16 or F16 (what dequantization rounds to) */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t n_blocks; /* ceil(numel / 64) */
    uint8_t *packed;   /* (numel + 1) / 2 bytes */
    int double_quant;
    float *absmax;      /* [n_blocks], single quantization */
    uint8_t *absmax_q;  /* [n_blocks], double quantization */
    uint64_t n_nested;  /* ceil(n_blocks / 256) */
    float *nested_absmax;
    float offset;
} nf4_tensor;

uint64_t nf4_packed_bytes(uint64_t numel);
uint64_t nf4_blocks(uint64_t numel);

/* Quantizes w[numel] (fp32 values of a tensor of the given dtype and shape; numel is the
 * shape's product).  *t is freed by nf4_free (also after a failure). */
int nf4_quantize(const float *w, st_dtype dtype, int ndim, const int64_t *shape, int double_quant,
                 nf4_tensor *t, errbuf *err);
void nf4_free(nf4_tensor *t);

/* nf4_quantize in pieces, for a tensor too large to hold in fp32 (proto/model_image.c):
 * w[n] are the tensor's values [first, first + n), first a multiple of 64 and n too unless
 * the piece ends the tensor; their codes go to packed[first / 2 ...] and their blocks' absmax
 * to absmax[first / 64 ...] of the whole tensor's arrays.  Pieces that cover a tensor give
 * nf4_quantize's packed bytes and (fp32) absmax. */
int nf4_quantize_chunk(const float *w, uint64_t first, uint64_t n, uint8_t *packed, float *absmax,
                       errbuf *err);
/* Double quantization of a tensor's fp32 absmax[n_blocks] (all of them: the offset is their
 * mean) into absmax_q[n_blocks], nested[ceil(n_blocks / 256)] and *offset. */
void nf4_double_quantize(const float *absmax, uint64_t n_blocks, uint8_t *absmax_q, float *nested,
                         float *offset);

/* The per-block absmax dequantization uses: t->absmax, or under double quantization
 * dynamic_map[q] * nested_absmax + offset.  out[t->n_blocks]. */
void nf4_block_absmax(const nf4_tensor *t, float *out);
/* out[t->numel]: the dequantized values rounded to t->dtype, as fp32. */
int nf4_dequantize(const nf4_tensor *t, float *out, errbuf *err);

/* out[numel] = w[numel] (an fp32 tensor of that shape) quantized to NF4 with double
 * quantization and dequantized: the weights QLoRA's forward computes with (fsdpctl reference
 * and generate --quant nf4).  out may be w. */
int nf4_round_trip(const float *w, int ndim, const int64_t *shape, float *out, errbuf *err);

/* x rounded to dtype (F32: as is; BF16, F16: nearest even), back as fp32. */
float nf4_round_to(st_dtype dtype, float x);

/* ---- the bnb-4bit layout: W.weight, W.weight.absmax, W.weight.quant_map, ... ---- */

/* The JSON bitsandbytes packs into W.weight.quant_state.bitsandbytes__nf4 (QuantState.as_dict:
 * json.dumps of quant_type, blocksize, dtype, shape and, nested, nested_blocksize,
 * nested_dtype, nested_offset, in that order). */
typedef struct nf4_quant_state {
    st_dtype dtype; /* "float32" / "bfloat16" / "float16" */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int nested;
    double nested_offset; /* the fp32 offset, as Python's float */
} nf4_quant_state;

#define NF4_STATE_SUFFIX ".quant_state.bitsandbytes__nf4"
#define NF4_STATE_MAX 4096 /* the longest quant_state accepted, bytes */

/* Strict: a JSON object of exactly those keys (nested ones all or none), quant_type "nf4",
 * blocksize 64, nested_blocksize 256, nested_dtype "float32", a finite nested_offset, a
 * shape of 1..8 positive dims; errors name the field. */
int nf4_state_parse(const void *buf, size_t len, nf4_quant_state *s, errbuf *err);
/* The bytes bitsandbytes writes for s (Python's json.dumps: ", " and ": " separators, the
 * offset as Python's repr); malloc'd, *len bytes without a NUL; NULL when out of memory. */
char *nf4_state_format(const nf4_quant_state *s, size_t *len);
void nf4_state_of(const nf4_tensor *t, nf4_quant_state *s);

/* Reads the quantized weight `base` (e.g. "model.layers.0.mlp.up_proj.weight") of a bnb-4bit
 * model: every companion tensor checked (dtype, shape, the code tables equal to bnb's), *t
 * filled (nf4_free it) and, when dq is not NULL, *dq = its dequantized values (malloc'd,
 * t->numel, rounded to t->dtype). */
int nf4_read_bnb_tensor(const st_model *m, const char *base, nf4_tensor *t, float **dq,
                        errbuf *err);

/* The tensors bitsandbytes saves for `base`: base (uint8 [packed, 1]), base.absmax, and
 * nested base.nested_absmax, base.nested_quant_map; then base.quant_map and the quant_state
 * (uint8 bytes).  names[i] are written into name_buf (NF4_MAX_OUT * ST_MAX_NAME bytes);
 * *state is the malloc'd quant_state the last tensor points at (the caller frees it).
 * Returns the number of tensors, or -1. */
/* config.json's quantization_config of a bnb-4bit model, as transformers writes it
 * (BitsAndBytesConfig.to_dict()). */
typedef struct nf4_model_quant {
    int double_quant;      /* bnb_4bit_use_double_quant */
    st_dtype compute_dtype; /* bnb_4bit_compute_dtype: F32, BF16 or F16 */
} nf4_model_quant;

/* Reads config (the whole config.json object): 0 and *q for a bitsandbytes 4-bit NF4 model
 * (quant_method "bitsandbytes", load_in_4bit true, load_in_8bit false, bnb_4bit_quant_type
 * "nf4", bnb_4bit_quant_storage "uint8"); 1 when it has no quantization_config; -1 with an
 * error naming the field for anything else (fp4, 8-bit, another method, a mistyped field).
 * The llm_int8_* fields are not read (they do not change a 4-bit model's tensors). */
int nf4_model_quant_parse(const json_t *config, nf4_model_quant *q, errbuf *err);
/* The quantization_config transformers writes for q (a new reference; NULL when out of
 * memory). */
json_t *nf4_model_quant_json(const nf4_model_quant *q);

#define NF4_MAX_OUT 6
int nf4_bnb_tensors(const char *base, const nf4_tensor *t, st_wtensor out[NF4_MAX_OUT],
                    char name_buf[NF4_MAX_OUT][ST_MAX_NAME], char **state, errbuf *err);

#endif
