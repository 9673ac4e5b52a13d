/* batch: a batch file, the safetensors form of token batches that the golden references
 * use (../shared/golden): `input_ids` and `labels`, [B, T], I32 (or I64 within int32's
 * range), labels -100 where masked.  fsdpctl reference runs the model on one; fsdpctl
 * tokenize --from-safetensors turns one into a token cache. */
#ifndef FSDP_BATCH_H
#define FSDP_BATCH_H

#include <stdint.h>

#include "base/errbuf.h"

typedef struct batch_file {
    int B, T;
    int32_t *input_ids, *labels; /* [B, T] each, malloc'd */
} batch_file;

/* Reads both tensors; they must be non-empty [B, T] matrices of the same shape. */
int batch_read(batch_file *b, const char *path, errbuf *err);
void batch_free(batch_file *b);

#endif
