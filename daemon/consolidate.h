/* consolidate: a sharded checkpoint (proto/ckpt.h) into a Hugging Face model directory,
 * streaming, in bounded memory (DESIGN.md, Checkpoints).  `fsdpctl consolidate` and fsdpd
 * (at the end of a job, into output.dir) call it.
 *
 * What it writes into OUT:
 *   model.safetensors, or model-0000k-of-0000n.safetensors + model.safetensors.index.json
 *     ({"metadata": {"total_size"}, "weight_map"}) when the weights exceed shard_bytes:
 *     tensors split in checkpoint order (transformers' state-dict order), a new file when the
 *     next tensor would not fit; inside a file, tensors sorted by name as the safetensors
 *     package writes them, back to back after a header padded with spaces to a multiple of
 *     8, metadata {"format": "pt"};
 *   config.json: the manifest's model_config with "dtype" set to the output dtype;
 *   generation_config.json: copied from the source model directory when it has one, else
 *     derived from the config (bos/eos/pad token ids, an eos list kept a list), as
 *     transformers does;
 *   the tokenizer files the source model directory has (tokenizer.json,
 *     tokenizer_config.json, special_tokens_map.json, tokenizer.model, chat_template.jinja).
 * The source model directory is tokenizer_from when given, else the manifest's model_path
 * (the model.path the job started from; none for init random).  A model_path that is no
 * longer a directory only sets result->warning: the weights are written without it.
 *
 * How: only the master sections are read.  Each of `threads` threads takes whole output files
 * and streams each tensor through one buffer of buffer_bytes: pread from the shard files,
 * fp32 -> bf16 in place (or f32 as is), pwrite at the tensor's offset in the output file.
 * Memory is threads x buffer_bytes plus a few bytes per (tensor, chunk): it does not grow
 * with the model.  Every byte of every master section is read once; the CRC32C of each piece
 * read is kept and, once all files are written, the pieces of each section (and its padding,
 * read apart) are combined into the section's CRC32C and checked against the header's.
 *
 * Everything is written into OUT.partial/ (a stale one from an interrupted run is removed
 * first), each file fsynced, and then committed: renamed to OUT when OUT does not exist;
 * when OUT is an existing directory (fsdpd's output.dir, which holds metrics.jsonl), its
 * config.json is removed, stale weight files (model.safetensors, the index,
 * model-*-of-*.safetensors) are removed, the new files are moved in one by one and
 * config.json last, so a directory with a config.json holds a whole model.  On failure
 * OUT.partial is removed and OUT is left as it was (or, if the failure hit while moving
 * files in, without a config.json).
 *
 * An adapter job's checkpoint (the manifest's "adapter" block) is written as a PEFT adapter
 * directory instead (proto/peft.h): adapter_model.safetensors (in adapter_dtype: PEFT saves
 * the adapter weights' dtype; one file, never sharded; tensors by name, from the master
 * sections as above), adapter_config.json from the
 * manifest's adapter settings with base_model_name_or_path = its model_path, and the
 * tokenizer files; adapter_config.json plays config.json's part in the commit (moved in last;
 * an existing OUT loses its stale weights, config.json, adapter_config.json and merged/).
 * With merge, OUT/merged/ is also written: the whole model directory of the base (the
 * manifest's model_path, its st_model_fingerprint checked against the manifest's) with every
 * adapted weight W replaced by W + scale * B A (PEFT's merge_and_unload), computed in fp32
 * and written in dtype, every other tensor copied (through fp32), config.json,
 * generation_config.json and tokenizer files as above.  The merge streams too: the base is
 * mapped and read a chunk at a time, the adapter (small) is read back from the
 * adapter_model.safetensors just written.
 *
 * consolidate_merge (`fsdpctl merge`) writes that merged model from a base model directory
 * and a PEFT adapter directory, with the same commit (config.json last); tokenizer files and
 * generation_config.json come from the base directory.  A quantized (NF4) base is refused:
 * not built yet. */
#ifndef FSDP_CONSOLIDATE_H
#define FSDP_CONSOLIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "base/path.h"
#include "proto/safetensors.h"

#define CONSOLIDATE_BUFFER (64u << 20)         /* bytes per thread */
#define CONSOLIDATE_SHARD_SIZE UINT64_C(5000000000) /* "5GB", transformers' default */

/* What was done (filled by consolidate when options.result is not NULL). */
typedef struct consolidate_result {
    char ckpt[PATH_BYTES];     /* the step directory read */
    int64_t step;
    int files;           /* safetensors files written */
    int tensors;
    int tokenizer_files; /* copied from the source model directory */
    char tokenizer_source[PATH_BYTES]; /* that directory, "" for none */
    char warning[4400];  /* "" or why the manifest's model_path was not used */
    uint64_t bytes;      /* tensor bytes written (the index's total_size) */
    int adapter;         /* an adapter checkpoint: OUT is a PEFT adapter directory */
    int merged_files, merged_tensors; /* OUT/merged (consolidate with merge) */
    uint64_t merged_bytes;
    double seconds;      /* the whole consolidation, commit included */
} consolidate_result;

typedef struct consolidate_options {
    const char *ckpt;           /* a checkpoint directory (its `latest` is used) or a step-N
                                 * directory (one with a manifest.json) */
    const char *out;            /* the model directory to write */
    st_dtype dtype;             /* ST_BF16 or ST_F32: a model's (and the merged model's) */
    st_dtype adapter_dtype;     /* ST_BF16 or ST_F32: an adapter checkpoint's
                                 * adapter_model.safetensors */
    uint64_t shard_bytes;       /* largest safetensors file, as transformers' max_shard_size */
    int threads;                /* output files written at once, >= 1 */
    const char *tokenizer_from; /* the source model directory, or NULL for the manifest's
                                 * model_path */
    size_t buffer_bytes;        /* per thread, a multiple of 4; 0: CONSOLIDATE_BUFFER */
    int merge;                  /* an adapter checkpoint: also OUT/merged (else an error) */
    consolidate_result *result; /* may be NULL */
} consolidate_options;

int consolidate(const consolidate_options *o, errbuf *err);

/* The tokenizer files a Hugging Face model directory may hold, copied along with a model
 * (consolidate, fsdpctl quantize). */
#define HF_TOKENIZER_FILES 5
extern const char *const hf_tokenizer_files[HF_TOKENIZER_FILES];

typedef struct merge_options {
    const char *model_dir;   /* the base model directory (Hugging Face) */
    const char *adapter_dir; /* a PEFT adapter directory */
    const char *out;         /* the merged model directory to write */
    st_dtype dtype;          /* ST_BF16 or ST_F32 */
    uint64_t shard_bytes;
    int threads;
    size_t buffer_bytes;     /* 0: CONSOLIDATE_BUFFER */
    consolidate_result *result; /* may be NULL; files, tensors, bytes: the merged model's */
} merge_options;

int consolidate_merge(const merge_options *o, errbuf *err);

#endif
