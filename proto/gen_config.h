/* gen_config: what fsdpd reads of a model's generation_config.json (transformers'
 * GenerationConfig): the stop ids, eos_token_id, an id or a list of ids (every other key is
 * transformers' and ignored).  A missing file has none; a file that is not a JSON object, or
 * an eos_token_id that is neither an id nor a list of ids in [0, 2^31), is an error naming
 * the file and the key. */
#ifndef FSDP_GEN_CONFIG_H
#define FSDP_GEN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"

#define GEN_CONFIG_NAME "generation_config.json"
#define GEN_CONFIG_MAX_STOP 64
#define GEN_CONFIG_MAX_BYTES (1u << 20)

typedef struct gen_config {
    int n_eos;
    int32_t eos[GEN_CONFIG_MAX_STOP];
} gen_config;

/* Parses the file's text; name starts every message.  The fuzzing entry point. */
int gen_config_parse(gen_config *g, const char *text, size_t len, const char *name, errbuf *err);
/* model_dir/generation_config.json, or none (n_eos 0) when there is no such file. */
int gen_config_read(gen_config *g, const char *model_dir, errbuf *err);

#endif
