/* ckpt: the sharded checkpoint format (DESIGN.md, Checkpoints) — the one definition shared
 * by the workers that write shard files, fsdpd that commits them, resume, and consolidation.
 *
 * ---- Directory ----
 *
 *     CKPT/step-000400.partial.3/   being written (3: the attempt, see below)
 *     CKPT/step-000400/             committed: manifest.json + rank-00000-of-00016.bin ...
 *     CKPT/latest -> step-000400    symlink, swapped atomically after each commit
 *     CKPT/superseded/step-000800/  a committed step moved aside by a run that started from an
 *                                   earlier one (never pruned, never resumed by `latest`)
 *     CKPT/fsdpd.lock               the leader's lock (proto/ckpt_lock.h)
 *     CKPT/memory-manifest.json     the manifest of the newest in-memory checkpoint, whose
 *                                   shard files are in the nodes' memory (daemon/memory_ckpt.h);
 *                                   of this launch only, never a checkpoint by itself
 *
 * Only a directory named step-N that holds manifest.json is a checkpoint.  Step numbers have
 * at least six digits (ckpt_step_name).  The attempt number is unique per fsdpd run, so a late
 * writer of an abandoned save can never write into another save's directory.
 *
 * ---- Shard files ----
 *
 * rank-RRRRR-of-FFFFF.bin: the state of one shard of the flat parameters — F files in all, F
 * the shard group size (the world size for full_shard; 1 for no_shard, written by rank 0).
 * Everything is little-endian.
 *
 *     [0, H)  header block, H = ckpt_header_block_bytes(n_units) = 64 + 32*n_sections rounded
 *             up to a multiple of 4096 (zero padded):
 *         0   char[8] magic "FSDPCKPT"
 *         8   u32 version (CKPT_VERSION)
 *         12  u32 header_bytes = 64 + 32*n_sections: the bytes the header CRC covers
 *         16  u32 rank: this file's index, 0 <= rank < n_files
 *         20  u32 n_files
 *         24  u32 n_units
 *         28  u32 n_sections = 3*n_units
 *         32  u64 step
 *         40  u64 file_bytes: the file's size
 *         48  u32 dtype: 1 = fp32 (the only one)
 *         52  u32 0, 56 u32 0 (reserved)
 *         60  u32 header_crc: CRC32C (base/crc32c.h) of bytes [0, header_bytes) with these
 *             four bytes read as zero
 *         64  section table, n_sections entries of 32 bytes:
 *             0 u32 kind (ckpt_kind), 4 u32 unit, 8 u64 offset, 16 u64 bytes,
 *             24 u32 crc: CRC32C of the section's bytes, 28 u32 0
 *     then the sections, in table order: kind-major (master of units 0..U-1, then exp_avg of
 *     units 0..U-1, then exp_avg_sq), each at the first multiple of 4096 at or after the end
 *     of the one before (zero padding between); the file ends with the last section.
 *
 * Section (kind, unit) of file r holds elements [r*S, (r+1)*S) of the unit's flat parameter,
 * as fp32, where S = the unit's shard = padded / n_files and padded = numel rounded up to a
 * multiple of n_files; elements past numel are padding (zero).  The flat parameter of a unit
 * is its tensors back to back in the manifest's order (their offsets), each row-major in its
 * Hugging Face shape.  The layout of a file is fully determined by the manifest's units and
 * n_files (ckpt_plan); readers check the header against it.
 *
 * ---- manifest.json (written by fsdpd after every file is in; tmp + fsync + rename) ----
 *
 *     "format": "fsdpd-checkpoint", "version": 1,
 *     "step": optimizer steps done (the next step is step+1),
 *     "optimizer_step": AdamW's step count (bias correction),
 *     "global_sample": samples consumed by the whole job (step * global_batch),
 *     "tokens_seen": unmasked target tokens trained on,
 *     "global_batch", "seed": fixed for the job's life (a resumed job takes them from here),
 *     "world_size": ranks of the job that wrote it, "sharding": the job's fsdp.sharding
 *     ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard": recorded, any reads any),
 *     "n_files": the shard group's world, one file a member (no_shard 1, hybrid_shard a
 *     node's workers: node 0's ranks write them), "dtype": "f32",
 *     "train": {"lr", "min_lr", "schedule", "warmup_steps", "warmup_ratio", "total_steps", "weight_decay",
 *               "betas": [b1, b2], "eps", "clip_norm", "objective": "sft" | "dpo" | "orpo",
 *               "dpo_beta", "dpo_loss", "dpo_label_smoothing", "orpo_lambda"} (the objective's
 *               keys absent in manifests written before F49: "sft" and the defaults; a resume
 *               refuses any change of them),
 *     "model_config": the model's Hugging Face config.json object,
 *     "model_path": the Hugging Face model directory the job started from (model.path, made
 *               absolute), "" for a job of model.init "random"; consolidation copies the
 *               tokenizer files and generation_config.json from it,
 *     "adapter": absent or null for a full fine-tune; for an adapter job (F27) the
 *               adapters' settings and the base they adapt, which resume checks:
 *               {"type": "lora" | "qlora", "rank", "alpha", "rslora", "dropout",
 *                "targets": ["q_proj", ...] (lora_layout.h's order),
 *                "base_fingerprint": 64 hex digits (st_dir_fingerprint of model_path)},
 *               and then "units" are the adapter units (lora_layout.h: one per decoder
 *               layer, tensors under PEFT's saved names), the frozen base not saved,
 *     "identity": the job's identity (F36), which a resume compares with its own
 *               (ckpt_identity_compare): {"train_type": "full" | "lora" | "qlora",
 *                "model_fingerprint": 64 hex digits (st_model_fingerprint of model_path, the
 *                    frozen base's for adapter jobs; for model.init random the SHA-256 of
 *                    its config and seed), "tokenizer_sha256": 64 hex digits or "" (no
 *                    tokenizer.json), "optimizer": "adamw",
 *                "data": {"source": "tokens" (a token cache) | "jsonl" (tokenized by fsdpd),
 *                         "sha256": tokens: of the cache's 128-byte header (its counts and
 *                         the CRC32C of everything after it); jsonl: of the JSONL file,
 *                         "format", "template", "seq_len", "packing", "shuffle",
 *                         "eval_fraction"},
 *                "max_steps", "epochs"}; absent in manifests written before F36 (their
 *               identity is unknown: only checkpoint.resume force resumes them),
 *     "units": [{"numel", "padded", "shard",
 *                "tensors": [{"name", "offset", "shape": [..], "is_norm"}, ...]}, ...]
 *              (unit 0 = embedding, 1..L = decoder layers, L+1 = final norm + lm_head),
 *     "files": [{"name": "rank-00000-of-00002.bin", "rank", "bytes", "header_crc32c"}, ...]
 *
 * Every key is required and of its type: a manifest without one is refused, naming the key;
 * but model_path, which came in with F17 within version 1, may be absent (a manifest written
 * before it: the model directory is unknown, read as "", and consolidation copies tokenizer
 * files only with --tokenizer-from), so older checkpoints still resume.
 *
 * A file's header_crc32c covers its section table, which holds each section's CRC32C: the
 * manifest thus pins every byte of every section.
 *
 * ---- Re-slicing ----
 *
 * A job of any world size reads any checkpoint: the new rank's elements [a, b) of a unit's
 * flat parameter come from old files a/S .. (b-1)/S (ckpt_read_range).  Every section read is
 * read whole once and checked against its CRC32C before its bytes are used. */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errbuf.h"
#include "job.h"
#include "lora_layout.h"
#include "model_config.h"

#define CKPT_FORMAT "fsdpd-checkpoint"
#define CKPT_VERSION 1
#define CKPT_MAGIC "FSDPCKPT"
#define CKPT_FIXED_HEADER 64
#define CKPT_SECTION_ENTRY 32
#define CKPT_ALIGN 4096
#define CKPT_DTYPE_F32 1
#define CKPT_KINDS 3
#define CKPT_MANIFEST "manifest.json"
#define CKPT_LATEST "latest"
#define CKPT_SUPERSEDED "superseded" /* committed steps a resume from an earlier one moved aside */
#define CKPT_MEMORY_MANIFEST "memory-manifest.json" /* the newest in-memory checkpoint's manifest */
#define CKPT_MANIFEST_MAX (256u << 20)
#define CKPT_NAME_MAX 64
#define CKPT_TENSOR_NAME_MAX 96

/* The numbers are on disk. */
typedef enum ckpt_kind {
    CKPT_MASTER = 1,     /* fp32 master parameters */
    CKPT_EXP_AVG = 2,    /* AdamW m */
    CKPT_EXP_AVG_SQ = 3, /* AdamW v */
} ckpt_kind;

/* "master", "exp_avg", "exp_avg_sq"; "unknown" otherwise. */
const char *ckpt_kind_name(int kind);

/* ---- names ---- */

/* "step-000400"; "step-000400.partial.3"; "rank-00001-of-00016.bin".  -1 when out is too
 * small. */
int ckpt_step_name(char *out, size_t n, int64_t step);
int ckpt_partial_name(char *out, size_t n, int64_t step, int attempt);
int ckpt_file_name(char *out, size_t n, int rank, int n_files);
/* The shard files of a job's checkpoint at world size `world`: one a rank of the shard group,
 * which writes them (no_shard: rank 0; hybrid_shard: node 0's ranks). */
int ckpt_n_files(const job_config *j, int world);
/* 1 and the numbers when name has that form, else 0. */
int ckpt_parse_step_name(const char *name, int64_t *step);
int ckpt_parse_partial_name(const char *name, int64_t *step, int *attempt);

/* ---- layout ---- */

typedef struct ckpt_tensor {
    char name[CKPT_TENSOR_NAME_MAX]; /* Hugging Face name */
    uint64_t offset;                 /* elements from the start of the unit's flat parameter */
    uint64_t numel;
    int ndim;                        /* 1 or 2 */
    int64_t shape[2];
    int is_norm;
} ckpt_tensor;

typedef struct ckpt_unit {
    uint64_t numel;  /* elements of the flat parameter */
    uint64_t padded; /* numel rounded up to a multiple of n_files */
    uint64_t shard;  /* padded / n_files */
    int first, count; /* its tensors: layout.tensors[first .. first+count) */
} ckpt_unit;

typedef struct ckpt_layout {
    int n_files;
    int n_units;
    ckpt_unit *units;
    int n_tensors;
    ckpt_tensor *tensors; /* unit by unit, each unit's in flat order */
} ckpt_layout;

/* Allocates zeroed units and tensors. */
int ckpt_layout_alloc(ckpt_layout *lo, int n_files, int n_units, int n_tensors, errbuf *err);
void ckpt_layout_free(ckpt_layout *lo);
/* The layout of a model's or an adapter's units and tensors (llama_layout, lora_layout) in
 * n_files files: padded and shard from numel and n_files; checked. */
int ckpt_layout_from_slots(ckpt_layout *lo, int n_files, const llama_unit *units, int n_units,
                           const llama_tensor_slot *tensors, int n_tensors, errbuf *err);
/* Checks the arithmetic: padded and shard from numel and n_files, tensors contiguous from
 * offset 0 and filling numel, numel = product of the shape. */
int ckpt_layout_check(const ckpt_layout *lo, errbuf *err);
/* The manifest's "units" array (new reference; NULL when out of memory). */
json_t *ckpt_layout_to_json(const ckpt_layout *lo);
/* Reads a "units" array for n_files files and checks it (ckpt_layout_check). */
int ckpt_layout_from_json(ckpt_layout *lo, const json_t *units, int n_files, const char *name,
                          errbuf *err);

/* ---- shard files ---- */

typedef struct ckpt_section {
    uint32_t kind, unit;
    uint64_t offset, bytes;
    uint32_t crc;
} ckpt_section;

typedef struct ckpt_file_header {
    uint32_t rank, n_files, n_units;
    uint64_t step;
    uint64_t file_bytes;
    uint64_t header_block; /* bytes before the first section */
    uint32_t crc;          /* header_crc */
    int n_sections;
    ckpt_section *sections;
} ckpt_file_header;

/* Bytes of the header block for n_units units. */
uint64_t ckpt_header_block_bytes(int n_units);
/* Index of section (kind, unit) in the table. */
static inline int ckpt_section_index(int n_units, int kind, int unit) {
    return (kind - 1) * n_units + unit;
}
/* Lays out file `rank` of a checkpoint of layout lo: every section's kind, unit, offset and
 * size (crc 0), the header block and file sizes.  h->sections is malloc'd. */
int ckpt_plan(ckpt_file_header *h, const ckpt_layout *lo, int rank, int64_t step, errbuf *err);
void ckpt_file_header_free(ckpt_file_header *h);
/* Writes the header block (h->header_block bytes, padding included) into block, computing the
 * header CRC into h->crc. */
void ckpt_encode_header(ckpt_file_header *h, void *block);
/* Parses and checks a header block (magic, version, sizes, CRC, section bounds); `name`
 * starts every message.  len may exceed the header. */
int ckpt_decode_header(ckpt_file_header *h, const void *buf, size_t len, const char *name,
                       errbuf *err);
/* Reads and decodes the header of an open file, and checks its size against file_bytes. */
int ckpt_read_header(ckpt_file_header *h, int fd, const char *path, errbuf *err);

/* Writes a staged file image: image holds h->file_bytes bytes laid out as ckpt_plan says,
 * sections filled in, the rest zero.  Computes each section's CRC (into h) and the header
 * (into the image), then writes path (created exclusively) in chunks and fsyncs it.  Before
 * each chunk, `progress` (when not NULL) is called with the bytes written so far; a non-zero
 * return stops the write (the message says it was abandoned).  On any failure the file is
 * removed. */
typedef int (*ckpt_progress_fn)(void *arg, uint64_t written, uint64_t total);
int ckpt_write_image(const char *path, void *image, ckpt_file_header *h,
                     ckpt_progress_fn progress, void *arg, errbuf *err);
/* In-memory checkpoints (F48; daemon/memory_ckpt.h): an image in shared memory is a shard
 * file in place.  ckpt_unseal_image breaks its magic before its sections are overwritten;
 * ckpt_seal_image computes every section's CRC (into h) and then encodes the header, magic
 * last in effect: a process killed anywhere between the two leaves an image whose header
 * does not decode, never a header over torn sections.  ckpt_write_sealed writes a sealed
 * image to path as ckpt_write_image does, without computing the CRCs again. */
void ckpt_unseal_image(void *image);
void ckpt_seal_image(void *image, ckpt_file_header *h);
int ckpt_write_sealed(const char *path, const void *image, const ckpt_file_header *h,
                      ckpt_progress_fn progress, void *arg, errbuf *err);

/* ---- manifest ---- */

typedef struct ckpt_train_settings {
    double lr, min_lr, weight_decay, betas[2], eps, clip_norm;
    char schedule[16]; /* "constant", "linear", "cosine" */
    int warmup_steps;
    double warmup_ratio; /* absent from manifests written before it: 0, "up" */
    char warmup_round[8]; /* "up" or "down" */
    int64_t total_steps;
    /* train.objective and its settings (F49); absent from manifests written before them:
     * "sft", the defaults */
    char objective[8];    /* "sft", "dpo", "orpo" */
    double dpo_beta, dpo_label_smoothing, orpo_lambda;
    char dpo_loss[12];    /* "sigmoid", "robust", "ipo" */
} ckpt_train_settings;

typedef struct ckpt_file_entry {
    char name[CKPT_NAME_MAX];
    int rank;
    uint64_t bytes;
    uint32_t header_crc;
} ckpt_file_entry;

/* An adapter job's manifest block ("adapter"). */
typedef struct ckpt_adapter {
    char type[8];          /* "lora" or "qlora" */
    lora_config lora;
    char base_fingerprint[65];
} ckpt_adapter;

/* What identifies the job's data: a token cache (data.path as given) or a JSONL file fsdpd
 * tokenized; and the tokenizer (daemon/data_prepare fills it). */
typedef struct ckpt_data_identity {
    char source[8];              /* "tokens" or "jsonl" */
    char sha256[65];             /* tokens: of the cache's header; jsonl: of the file */
    char tokenizer_sha256[65];   /* of the model's tokenizer.json, "" when it has none */
} ckpt_data_identity;

/* The manifest's "identity" block. */
typedef struct ckpt_identity {
    char train_type[8];          /* "full", "lora", "qlora" */
    char model_fingerprint[65];
    char optimizer[8];           /* "adamw" */
    ckpt_data_identity data;
    char data_format[8];         /* data.format */
    char data_template[32];      /* data.template ("" = auto) */
    int seq_len, packing, shuffle;
    double eval_fraction;
    int max_steps, epochs;
} ckpt_identity;

typedef struct ckpt_manifest {
    int64_t step, optimizer_step, global_sample, tokens_seen, seed;
    int global_batch;
    int world_size;
    char sharding[16];      /* the job's fsdp.sharding, e.g. "full_shard" */
    ckpt_train_settings train;
    json_t *model_config;   /* owned reference: the Hugging Face config.json object */
    char model_path[JOB_PATH_MAX]; /* the job's model directory, "" for init random */
    int has_adapter;        /* an adapter job: units are adapters (ckpt_adapter) */
    ckpt_adapter adapter;
    int has_identity;       /* 0: written before F36, the job's identity unknown */
    ckpt_identity identity;
    ckpt_layout layout;     /* layout.n_files files */
    ckpt_file_entry *files; /* [layout.n_files], files[r].rank == r */
} ckpt_manifest;

/* The manifest as JSON text (indented; malloc'd). */
int ckpt_manifest_to_json(const ckpt_manifest *m, char **text, errbuf *err);
/* Parses and checks manifest text (every key present and of its type, the layout's
 * arithmetic, one file per rank with the planned size). */
int ckpt_manifest_parse(ckpt_manifest *m, const char *text, size_t len, const char *name,
                        errbuf *err);
/* Reads CKPT_PATH/manifest.json; _file: the manifest at path (the memory manifest). */
int ckpt_manifest_load(ckpt_manifest *m, const char *ckpt_path, errbuf *err);
int ckpt_manifest_load_file(ckpt_manifest *m, const char *path, errbuf *err);
void ckpt_manifest_free(ckpt_manifest *m);
/* The manifest's model is cfg: same sizes, heads, vocabulary, norm epsilon, RoPE and tying;
 * otherwise an error naming the first difference. */
int ckpt_manifest_check_model(const ckpt_manifest *m, const llama_config *cfg, const char *name,
                              errbuf *err);

/* One way the checkpoint's job differs from the resuming one: the field ("train.lr",
 * "identity.data.sha256"), both values as text, and whether the documented rule allows
 * the change (train.max_steps, train.epochs: logged only). */
typedef struct ckpt_difference {
    char field[40];
    char checkpoint[96], job[96];
    int allowed;
} ckpt_difference;
#define CKPT_MAX_DIFFERENCES 40

/* Compares the manifest's identity, train settings and adapter settings (type, alpha,
 * dropout, rslora; rank and targets change the shapes, ckpt_commit refuses them first) with
 * the job's (id, train, adapter: NULL for a full fine-tune); fills out[] (up to
 * CKPT_MAX_DIFFERENCES) and returns how many differ.  A manifest without an identity gives
 * one difference, "identity", not allowed. */
int ckpt_identity_compare(const ckpt_manifest *m, const ckpt_identity *id, const ckpt_train_settings *train,
                          const ckpt_adapter *adapter, ckpt_difference *out);

/* Checks file `file` of the checkpoint in ckpt_path against the manifest: present, the
 * manifest's size, a header that decodes, matches the plan and has the manifest's CRC; with
 * check_data, also every section's CRC32C (reads the whole file). */
int ckpt_verify_file(const char *ckpt_path, const ckpt_manifest *m, int file, int check_data,
                     errbuf *err);
/* The open fd (named `name` in messages) holds file `file` of m: its header decodes, matches
 * the plan, and has the manifest's size, step and header CRC (an in-memory image). */
int ckpt_check_fd(int fd, const char *name, const ckpt_manifest *m, int file, errbuf *err);
/* Which of a rank's two in-memory images (fd[0], fd[1]) holds file `file` of m (as
 * ckpt_check_fd checks): 0 or 1, or -1 with why for both. */
int ckpt_find_image(const int fd[2], const ckpt_manifest *m, int file, errbuf *err);
/* ckpt_verify_file for every file. */
int ckpt_verify(const char *ckpt_path, const ckpt_manifest *m, int check_data, errbuf *err);

/* ---- reading with re-slicing ---- */

typedef struct ckpt_reader {
    char *path;                /* the checkpoint directory */
    const ckpt_manifest *m;
    int *fds;                  /* [n_files], -1 until first used */
    ckpt_file_header *headers; /* [n_files], checked against the manifest when opened */
    uint8_t *verified;         /* [n_files * n_sections]: section read whole and CRC-checked */
    void *chunk;
    size_t chunk_bytes;
} ckpt_reader;

/* m must outlive the reader. */
int ckpt_reader_open(ckpt_reader *r, const char *ckpt_path, const ckpt_manifest *m, errbuf *err);
/* dst[n] = elements [first, first+n) of the flat parameter `kind` of unit `unit`, whatever
 * files hold them; elements at or past the unit's numel read as zero.  A section is read
 * whole and CRC-checked the first time it is touched; errors name the file and section. */
int ckpt_read_range(ckpt_reader *r, int kind, int unit, uint64_t first, uint64_t n, float *dst,
                    errbuf *err);
/* File `file` is read from fd (checked as ckpt_check_fd does; the reader closes it), not
 * from the directory: an in-memory image. */
int ckpt_reader_adopt(ckpt_reader *r, int file, int fd, const char *name, errbuf *err);
void ckpt_reader_close(ckpt_reader *r);

/* ---- the checkpoint directory ---- */

/* The checkpoint a job resumes from: JOB_RESUME_NEVER gives 0; AUTO gives 1 and
 * DIR/step-N when DIR/latest names a committed checkpoint, else 0; LATEST and FORCE require
 * latest;
 * STEP requires DIR/step-N (resume_step).  A latest or step-N that is not a committed
 * checkpoint (no manifest) is an error, naming the path.  Returns 1, 0 or -1. */
int ckpt_resolve(const char *dir, job_resume mode, int64_t resume_step, char *out, size_t n,
                 errbuf *err);
/* The committed checkpoints in dir (step-N with a manifest), steps ascending; *steps is
 * malloc'd (NULL when none).  A missing dir has none. */
int ckpt_list(const char *dir, int64_t **steps, int *n, errbuf *err);

#endif
