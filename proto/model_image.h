/* model_image: a whole model's parameters in flat-parameter order (proto/model_layout.h), the
 * form in which fsdpd holds the model once per node in shared memory and every worker copies
 * its shard slices out of (DESIGN.md, Node-shared memory).
 *
 *     [0, H)   header, H = model_image_header_bytes(n_units) (a multiple of 4096):
 *         0   char[8] magic "FSDPMIMG"
 *         8   u32 version 1
 *         12  u32 dtype (MODEL_IMAGE_F32 or MODEL_IMAGE_BF16)
 *         16  u32 n_units
 *         20  u32 0
 *         24  u64 total bytes of the image
 *         32  per unit: u64 byte offset of its data, u64 element count
 *     then each unit's flat parameter (numel elements of dtype, no padding) at a 4096-aligned
 *     offset.
 * Little-endian.  Readers check the header against the layout they expect. */
#ifndef FSDP_MODEL_IMAGE_H
#define FSDP_MODEL_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "model_layout.h"
#include "safetensors.h"

typedef enum model_image_dtype { MODEL_IMAGE_F32 = 1, MODEL_IMAGE_BF16 = 2 } model_image_dtype;

/* Total bytes of the image of layout lo in dtype dt. */
size_t model_image_bytes(const llama_layout *lo, model_image_dtype dt);

/* Called now and then while filling, with the bytes done so far. */
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

/* Checks an image of len bytes against the layout (magic, version, sizes, every unit's
 * offset and element count). */
int model_image_check(const void *image, size_t len, const llama_layout *lo, errbuf *err);
/* dst[n] (fp32) = elements [first, first+n) of unit u of a checked image. */
void model_image_read_f32(const void *image, const llama_layout *lo, int unit, size_t first,
                          size_t n, float *dst);
/* Maps an image file (fsdpd's memfd, inherited) read-only and checks it against the layout;
 * munmap(*image, *bytes) releases it. */
int model_image_map(int fd, const llama_layout *lo, const void **image, size_t *bytes,
                    errbuf *err);

#endif
