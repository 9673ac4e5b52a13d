/* safetensors: read (mmap, zero-copy) and write the Hugging Face tensor file format,
 * single files and the sharded form (model.safetensors.index.json + model-0000k-of-0000n).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON header, then the data.
 * The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the start of the data) plus an optional "__metadata__" object of
 * string values.  Files are written as the reference implementation writes them: header
 * padded with spaces to a multiple of 8 bytes, tensors back to back in header order, no
 * gaps and nothing after the last tensor; the reader rejects anything else. */
#ifndef FSDP_SAFETENSORS_H
#define FSDP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errbuf.h"

#define ST_MAX_DIMS 8
#define ST_MAX_NAME 256
#define ST_MAX_HEADER (100u << 20) /* the reference reader's bound: 100 MB */
#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_NAME "model.safetensors.index.json"

typedef enum st_dtype {
    ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
    ST_DTYPE_COUNT
} st_dtype;

size_t st_dtype_size(st_dtype d);
const char *st_dtype_name(st_dtype d);            /* "F32", "BF16", ... */
int st_dtype_parse(const char *s, st_dtype *out); /* 0, or -1 when unknown */

typedef struct st_tensor {
    char name[ST_MAX_NAME];
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t nbytes;
    const void *data; /* points into the file's mapping (reader) */
} st_tensor;

typedef struct st_meta {
    char *key, *value;
} st_meta;

/* One open file: a read-only mapping and its parsed header. */
typedef struct st_file {
    char *path;
    void *map;
    size_t map_len;
    int n_tensors;
    st_tensor *tensors; /* in data order */
    int n_meta;
    st_meta *meta;
} st_file;

/* Maps and validates a file; on error names the file and the problem. */
int st_open(st_file *f, const char *path, errbuf *err);
/* Validates an in-memory image (the whole file); `name` is used in messages.  The
 * tensors' data pointers point into buf, which must outlive f.  st_close frees f's
 * allocations without unmapping buf.  This is the fuzzing entry point. */
int st_parse(st_file *f, const void *buf, size_t len, const char *name, errbuf *err);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
const char *st_meta_get(const st_file *f, const char *key);

/* A tensor to write: the caller's description plus a pointer to its bytes. */
typedef struct st_wtensor {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} st_wtensor;

/* Writes path atomically (path.tmp, fsync, rename, fsync of the directory) with
 * __metadata__ {"format":"pt"} plus the given extra pairs (may be NULL/0). */
int st_write(const char *path, const st_wtensor *t, int n, const st_meta *meta, int n_meta,
             errbuf *err);

/* The header st_write writes (the 8-byte length, then the JSON padded with spaces to a
 * multiple of 8), data offsets in the given order; the tensors' data is not needed, for a
 * writer that streams it after the header.  malloc'd, *len bytes. */
char *st_header(const st_wtensor *t, int n, const st_meta *meta, int n_meta, size_t *len,
                const char *path, errbuf *err);
/* model.safetensors.index.json: {"metadata": {"total_size"}, "weight_map": {name: file}}
 * (a new reference; NULL when out of memory). */
json_t *st_index_json(const char *const *names, const char *const *files, int n, uint64_t total_size);

/* A model directory: model.safetensors, or model.safetensors.index.json and its shards.
 * Tensor names are unique across shards. */
typedef struct st_model {
    char *dir;
    int n_files;
    st_file *files;
    int n_tensors;
    const st_tensor **tensors; /* sorted by name, pointing into files */
} st_model;

int st_model_open(st_model *m, const char *dir, errbuf *err);
void st_model_close(st_model *m);
const st_tensor *st_model_find(const st_model *m, const char *name);

/* The model's fingerprint as 64 hex digits (+ NUL): SHA-256 over every tensor in name order
 * (its name, dtype, shape, and its data: whole up to 64 KiB, else 8 samples of 8 KiB at
 * evenly spaced offsets).  What an adapter checkpoint records of its base: any other base
 * (other weights, shapes or dtype) gives another fingerprint with near certainty, at the
 * cost of reading ~64 KiB a tensor, however big the model; how the tensors are split into
 * files does not change it. */
#define ST_FINGERPRINT_HEX 65
void st_model_fingerprint(const st_model *m, char hex[ST_FINGERPRINT_HEX]);

/* Writes tensors into dir as model.safetensors when they fit in shard_bytes, else as
 * model-0000k-of-0000n.safetensors + model.safetensors.index.json (metadata total_size),
 * splitting in the given order. */
int st_write_model(const char *dir, const st_wtensor *t, int n, uint64_t shard_bytes,
                   errbuf *err);

/* dst[n] = elements [first, first+n) of a floating-point tensor (F32, F64, BF16, F16) as
 * fp32; any other dtype is an error naming the tensor.  The caller keeps first+n <= numel. */
int st_read_f32(const st_tensor *t, size_t first, size_t n, float *dst, errbuf *err);

/* 0 when v[n] (elements [first, first+n) of tensor `name`) are all finite; else -1 with
 * "WHERE: tensor NAME: element K is nan (or inf, -inf): WHY" (where and why may be "";
 * weights read for a merge or a fine-tune are refused this way, never passed on). */
int st_check_finite(const float *v, size_t n, size_t first, const char *where, const char *name,
                    const char *why, errbuf *err);


#endif
