/* model_image: a whole model's parameters in flat-parameter order (proto/model_layout.h), the
 * form in which fsdpd holds the model once per node in shared memory and every worker copies
 * its shard slices out of (DESIGN.md, Node-shared memory).
 *
 *     [0, H)   header, H = model_image.c's header_bytes(n_units) (a multiple of 4096):
 *         0   char[8] magic "FSDPMIMG"
 *         8   u32 version 1
 *         12  u32 dtype (MODEL_IMAGE_F32 or MODEL_IMAGE_BF16)
 *         16  u32 n_units
 *         20  u32 quant (model_image_quant: 0 plain, else NF4, see below)
 *         24  u64 total bytes of the image
 *         32  per unit: u64 byte offset of its data, u64 element count
 *     then each unit's flat parameter (numel elements of dtype, no padding) at a 4096-aligned
 *     offset.
 * Little-endian.  Readers check the header against the layout they expect.
 *
 * An NF4 image (QLoRA: DESIGN.md, LoRA and QLoRA) holds the linears of every decoder layer
 * quantized as bitsandbytes does (proto/nf4.h), the rest in dtype.  A decoder layer's unit data
 * is then laid out by model_image_nf4_layer (the same for every layer), each region 64-byte
 * aligned:
 *     norms     the layer's other tensors in their unit order, in dtype: input_layernorm and
 *               post_attention_layernorm (C elements each), then the family's extras
 *               (Qwen2's q/k/v biases, Qwen3's q_norm/k_norm): n_plain elements, as they
 *               follow the linears in the unit (an element at unit offset o sits at o - the
 *               linears' numel)
 *     packed    the NF4 codes of q, k, v, o, gate, up, down, back to back (numel / 2 bytes each)
 *     absmax    their blocks' absmax: uint8 codes (double quantization) or fp32, back to back
 *     nested    double quantization: each linear's nested absmax (fp32, one per 256 blocks)
 *     offsets   double quantization: each linear's offset (fp32)
 * The embedding and the head unit are plain. */
#ifndef FSDP_MODEL_IMAGE_H
#define FSDP_MODEL_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "model_layout.h"
#include "safetensors.h"

typedef enum model_image_dtype { MODEL_IMAGE_F32 = 1, MODEL_IMAGE_BF16 = 2 } model_image_dtype;
/* The numbers are in the header. */
typedef enum model_image_quant {
    MODEL_IMAGE_PLAIN = 0,
    MODEL_IMAGE_NF4 = 1,    /* absmax fp32 per 64-value block */
    MODEL_IMAGE_NF4_DQ = 2, /* double quantization: absmax as 8-bit codes, nested absmax, offset */
} model_image_quant;

#define MODEL_IMAGE_LINEARS 7 /* q, k, v, o, gate, up, down: a layer's first tensors */

/* Where a decoder layer's parts sit in an NF4 image's unit data (bytes from its start), and
 * each linear's first byte (packed), block (absmax) and nested value. */
typedef struct model_image_nf4_layer {
    size_t norms, packed, absmax, nested, offsets, bytes;
    size_t n_plain; /* elements of the norms region: the layer's tensors after its linears */
    size_t packed_bytes, absmax_bytes, n_nested;
    size_t t_packed[MODEL_IMAGE_LINEARS], t_block[MODEL_IMAGE_LINEARS];
    size_t t_nested[MODEL_IMAGE_LINEARS], t_numel[MODEL_IMAGE_LINEARS];
} model_image_nf4_layer;
void model_image_nf4_layer_of(const llama_layout *lo, model_image_dtype dt, model_image_quant q,
                              model_image_nf4_layer *out);

/* Total bytes of the image of layout lo in dtype dt (plain). */
size_t model_image_bytes(const llama_layout *lo, model_image_dtype dt);
size_t model_image_bytes_q(const llama_layout *lo, model_image_dtype dt, model_image_quant q);

/* Called now and then while filling, with the bytes done so far (never fewer than before), and
 * once at the end, after a fill that succeeded, with all of them. */
typedef void (*model_image_progress)(void *arg, size_t done, size_t total);

/* Write the header, then every tensor: from a Hugging Face checkpoint (F32/BF16/F16/F64
 * tensors converted; a missing tensor or another shape is an error naming it), or Hugging
 * Face's init drawn as `fsdpctl init` draws it (normal(0, initializer_range), norms 1;
 * tensor i of the layout from stream (INIT, i)).  image holds model_image_bytes. */
int model_image_fill_hf(void *image, const llama_layout *lo, model_image_dtype dt,
                        const st_model *st, model_image_progress progress, void *arg,
                        errbuf *err);
int model_image_fill_random(void *image, const llama_layout *lo, model_image_dtype dt,
                            uint64_t seed, model_image_progress progress, void *arg,
                            errbuf *err);

/* How the fills share the work: model_image_fill_threads() threads (every core, at most
 * MODEL_IMAGE_MAX_THREADS), each converting or drawing MODEL_IMAGE_CHUNK values (whole NF4
 * blocks) at a time. */
#define MODEL_IMAGE_CHUNK (1u << 20)
#define MODEL_IMAGE_MAX_THREADS 64
int model_image_fill_threads(void);

/* An NF4 image: the linears quantized from the checkpoint's weights as dtype holds them
 * (from st; st NULL: from Hugging Face's init drawn as model_image_fill_random draws it,
 * seed), or (bnb set) copied as they are from a bitsandbytes 4-bit model directory, whose
 * quantization must be q's.  A tensor per thread at a time, quantized MODEL_IMAGE_CHUNK
 * values at a time straight into the image (the same bytes as nf4_quantize of the whole
 * tensor), so the model is never held in fp32 or dtype beside the image: a thread holds
 * MODEL_IMAGE_CHUNK fp32 values (4 MiB) and, under double quantization, the fp32 absmax of
 * the linear it quantizes (numel / 16 bytes: 14.7 MB for Llama-2-70B's MLP), at most
 * model_image_fill_threads() x (4 MiB + the largest linear's numel / 16) in all (300 MB for
 * a 70B on 16 cores), besides the checkpoint's mapped pages (the page cache's).  The bnb copy
 * holds one stored linear's arrays per thread instead. */
int model_image_fill_nf4(void *image, const llama_layout *lo, model_image_dtype dt,
                         model_image_quant q, const st_model *st, int bnb, uint64_t seed,
                         model_image_progress progress, void *arg, errbuf *err);

/* The image's dtype and quantization (of a checked image). */
model_image_dtype model_image_dtype_of(const void *image);
model_image_quant model_image_quant_of(const void *image);
/* The start of unit u's data in a checked image. */
const unsigned char *model_image_unit(const void *image, const llama_layout *lo, int u);

/* Checks an image of len bytes against the layout (magic, version, sizes, every unit's
 * offset and element count). */
int model_image_check(const void *image, size_t len, const llama_layout *lo, errbuf *err);
/* dst[n] (fp32) = elements [first, first+n) of unit u of a checked plain image (of an NF4
 * image: the embedding or the head unit). */
void model_image_read_f32(const void *image, const llama_layout *lo, int unit, size_t first,
                          size_t n, float *dst);
/* Maps an image file (fsdpd's memfd, inherited) read-only and checks it against the layout;
 * munmap(*image, *bytes) releases it. */
int model_image_map(int fd, const llama_layout *lo, const void **image, size_t *bytes,
                    errbuf *err);

#endif
