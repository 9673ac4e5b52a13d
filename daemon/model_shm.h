/* model_shm: the model, once per node, in sealed shared memory (DESIGN.md, Node-shared
 * memory).  fsdpd converts the Hugging Face checkpoint (or draws a random init) into a
 * model image (proto/model_image.h) in an anonymous memfd, unmaps its writable mapping and
 * seals the file against any change; workers inherit the descriptor, map it read-only and
 * copy only their shard slices.  The kernel frees it when the last holder exits, so a
 * killed job leaves nothing behind, and /dev/shm's size does not bound it. */
#ifndef FSDP_MODEL_SHM_H
#define FSDP_MODEL_SHM_H

#include <stddef.h>

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/model_image.h"
#include "proto/model_layout.h"

/* How the job's base is held: plain; or for a QLoRA job NF4 with double quantization
 * (quantized here, on every core), or as the bitsandbytes 4-bit model.path has it (*bnb:
 * copied as it is).  config is the model's config.json object.  A bitsandbytes model for
 * any other job than train.type qlora is refused. */
int model_shm_quant(const job_config *job, const json_t *config, model_image_quant *q, int *bnb,
                    errbuf *err);

/* Creates the sealed image of the job's model (model.path, or model.init random with
 * train.seed) in the job's dtype, quantized as q says (model_shm_quant); `name` names the
 * memfd (visible in /proc/PID/fd).  Prints progress to stderr for large models.  *fd is
 * close-on-exec. */
int model_shm_create(const job_config *job, const llama_layout *lo, model_image_quant q, int bnb,
                     const char *name, int *fd, size_t *bytes, errbuf *err);

#endif
