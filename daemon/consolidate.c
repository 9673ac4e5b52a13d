/* consolidate: a sharded checkpoint into a Hugging Face model directory.  See consolidate.h. */
#include "base/bf16.h"
#include "base/path.h"
#include "daemon/consolidate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/fileio.h"
#include "proto/ckpt.h"
#include "proto/model_layout.h"
#include "proto/peft.h"

#define NAME_BYTES 64
#define CONFIG_NAME "config.json"
#define MERGED_NAME "merged" /* an adapter directory's merged model */
#define GENERATION_NAME "generation_config.json"
#define COPY_BUFFER (1u << 20) /* section padding */
#define MAX_THREADS 256

const char *const hf_tokenizer_files[HF_TOKENIZER_FILES] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "chat_template.jinja"};

/* ---- the checkpoint's shard files ---- */

typedef struct source {
    const char *dir;
    const ckpt_manifest *m;
    int *fds;
    ckpt_file_header *headers;
} source;

static int shard_path(char *out, const source *s, int file, errbuf *err) {
    return path_join(out, PATH_BYTES, s->dir, s->m->files[file].name, err);
}

static void source_close(source *s) {
    for (int f = 0; s->fds && f < s->m->layout.n_files; f++) {
        if (s->fds[f] >= 0) close(s->fds[f]);
        ckpt_file_header_free(&s->headers[f]);
    }
    free(s->fds);
    free(s->headers);
}

/* Opens every shard file, its header checked against the manifest (ckpt_verify_file) and
 * pinned by the manifest's header CRC. */
static int source_open(source *s, const char *dir, const ckpt_manifest *m, errbuf *err) {
    int n = m->layout.n_files;
    *s = (source){.dir = dir, .m = m};
    s->fds = malloc((size_t)n * sizeof *s->fds);
    s->headers = calloc((size_t)n, sizeof *s->headers);
    if (!s->fds || !s->headers) {
        free(s->fds);
        free(s->headers);
        return errf(err, "%s: out of memory", dir);
    }
    for (int f = 0; f < n; f++) s->fds[f] = -1;
    for (int f = 0; f < n; f++) {
        char path[PATH_BYTES];
        if (shard_path(path, s, f, err) || ckpt_verify_file(dir, m, f, 0, err)) goto fail;
        s->fds[f] = file_open_regular(path, err);
        if (s->fds[f] < 0) goto fail;
        if (ckpt_read_header(&s->headers[f], s->fds[f], path, err)) goto fail;
        if (s->headers[f].crc != m->files[f].header_crc) {
            errf(err, "%s: header CRC32C %08x, the manifest says %08x", path, s->headers[f].crc,
                 m->files[f].header_crc);
            goto fail;
        }
    }
    return 0;
fail:
    source_close(s);
    return -1;
}

/* ---- pieces read, for the CRC check ---- */

typedef struct piece {
    uint32_t file, unit;
    uint64_t at, bytes; /* within the master section of `unit` in shard file `file` */
    uint32_t crc;
} piece;

typedef struct piece_list {
    piece *v;
    size_t n, cap;
} piece_list;

static int piece_add(piece_list *l, piece p, errbuf *err) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 1024;
        piece *bigger = realloc(l->v, cap * sizeof *bigger);
        if (!bigger) return errf(err, "out of memory");
        l->v = bigger;
        l->cap = cap;
    }
    l->v[l->n++] = p;
    return 0;
}

/* dst[n] = elements [first, first+n) of unit's master flat parameter (all below its numel),
 * from whichever shard files hold them; each piece read is recorded with its CRC32C. */
static int read_master(const source *s, int unit, uint64_t first, uint64_t n, float *dst,
                       piece_list *pieces, errbuf *err) {
    const ckpt_unit *U = &s->m->layout.units[unit];
    int idx = ckpt_section_index(s->m->layout.n_units, CKPT_MASTER, unit);
    for (uint64_t at = first, end = first + n; at < end;) {
        int f = (int)(at / U->shard);
        uint64_t base = (uint64_t)f * U->shard, upto = base + U->shard < end ? base + U->shard : end;
        const ckpt_section *sec = &s->headers[f].sections[idx];
        uint64_t off = (at - base) * sizeof(float), bytes = (upto - at) * sizeof(float);
        float *into = dst + (at - first);
        char path[PATH_BYTES];
        if (shard_path(path, s, f, err) || file_pread_full(s->fds[f], into, (size_t)bytes, sec->offset + off, path, err))
            return -1;
        piece p = {(uint32_t)f, (uint32_t)unit, off, bytes, crc32c(0, into, (size_t)bytes)};
        if (piece_add(pieces, p, err)) return -1;
        at = upto;
    }
    return 0;
}

static int piece_cmp(const void *a, const void *b) {
    const piece *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    if (x->unit != y->unit) return x->unit < y->unit ? -1 : 1;
    return (x->at > y->at) - (x->at < y->at);
}

/* Folds bytes [at, end) of section sec, read from the file, into *crc (the padding past a
 * unit's last tensor, which no tensor reads). */
static int fold_unread(const source *s, int f, const ckpt_section *sec, uint64_t at, uint64_t end,
                       uint32_t *crc, void *buf, const char *path, errbuf *err) {
    while (at < end) {
        size_t n = end - at < COPY_BUFFER ? (size_t)(end - at) : COPY_BUFFER;
        if (file_pread_full(s->fds[f], buf, n, sec->offset + at, path, err)) return -1;
        *crc = crc32c_combine(*crc, crc32c(0, buf, n), n);
        at += n;
    }
    return 0;
}

/* Every master section's CRC32C, from the pieces read (sorted here) and its unread bytes. */
static int check_master_crcs(const source *s, piece *v, size_t n, errbuf *err) {
    const ckpt_layout *lo = &s->m->layout;
    void *buf = malloc(COPY_BUFFER);
    if (!buf) return errf(err, "%s: out of memory", s->dir);
    qsort(v, n, sizeof *v, piece_cmp);
    size_t i = 0;
    int rc = 0;
    for (int f = 0; f < lo->n_files && rc == 0; f++) {
        char path[PATH_BYTES];
        rc = shard_path(path, s, f, err);
        for (int u = 0; u < lo->n_units && rc == 0; u++) {
            const ckpt_section *sec = &s->headers[f].sections[ckpt_section_index(lo->n_units, CKPT_MASTER, u)];
            uint32_t crc = 0;
            uint64_t at = 0;
            for (; rc == 0 && i < n && v[i].file == (uint32_t)f && v[i].unit == (uint32_t)u; i++) {
                if (v[i].at < at)
                    rc = errf(err, "%s: unit %d: bytes %llu.. read twice", path, u, (unsigned long long)v[i].at);
                else if ((rc = fold_unread(s, f, sec, at, v[i].at, &crc, buf, path, err)) == 0)
                    crc = crc32c_combine(crc, v[i].crc, v[i].bytes);
                at = v[i].at + v[i].bytes;
            }
            if (rc == 0) rc = fold_unread(s, f, sec, at, sec->bytes, &crc, buf, path, err);
            if (rc == 0 && crc != sec->crc)
                rc = errf(err, "%s: section master of unit %d: CRC32C mismatch (stored %08x, computed "
                               "%08x): the file is corrupt", path, u, sec->crc, crc);
        }
    }
    free(buf);
    return rc;
}

/* ---- the output files' plan ---- */

typedef struct out_tensor {
    const ckpt_tensor *t;
    int unit;
    uint64_t begin; /* offset of its bytes in its file's data area */
} out_tensor;

typedef struct out_file {
    char name[NAME_BYTES];
    int first, count; /* its tensors: plan.tensors[first .. first+count) */
} out_file;

typedef struct plan {
    st_dtype dtype;
    size_t elem; /* bytes per element */
    int n_tensors, n_files;
    out_tensor *tensors; /* file by file, by name inside a file */
    out_file *files;
    uint64_t total_bytes;
} plan;

static void plan_free(plan *p) {
    free(p->tensors);
    free(p->files);
}

static int out_tensor_name_cmp(const void *a, const void *b) {
    return strcmp(((const out_tensor *)a)->t->name, ((const out_tensor *)b)->t->name);
}

/* Splits the tensors into files as st_write_model does (in checkpoint order, a new file when
 * the next tensor would overflow a non-empty one), sorts each file's tensors by name and lays
 * them out back to back; single_name is the file's name when there is one. */
static int plan_build(plan *p, const ckpt_layout *lo, st_dtype dtype, uint64_t shard_bytes,
                      const char *single_name, errbuf *err) {
    *p = (plan){.dtype = dtype, .elem = st_dtype_size(dtype), .n_tensors = lo->n_tensors};
    p->tensors = calloc((size_t)lo->n_tensors, sizeof *p->tensors);
    p->files = calloc((size_t)lo->n_tensors, sizeof *p->files); /* at most one per tensor */
    if (!p->tensors || !p->files) {
        plan_free(p);
        return errf(err, "out of memory");
    }
    uint64_t used = 0;
    for (int u = 0; u < lo->n_units; u++)
        for (int i = lo->units[u].first; i < lo->units[u].first + lo->units[u].count; i++) {
            uint64_t bytes = lo->tensors[i].numel * p->elem;
            if (p->n_files == 0 || (used > 0 && used + bytes > shard_bytes)) {
                p->files[p->n_files++].first = i;
                used = 0;
            }
            p->files[p->n_files - 1].count++;
            p->tensors[i] = (out_tensor){&lo->tensors[i], u, 0};
            used += bytes;
            p->total_bytes += bytes;
        }
    for (int f = 0; f < p->n_files; f++) {
        out_file *F = &p->files[f];
        if (p->total_bytes <= shard_bytes) snprintf(F->name, sizeof F->name, "%s", single_name);
        else snprintf(F->name, sizeof F->name, "model-%05d-of-%05d.safetensors", f + 1, p->n_files);
        qsort(p->tensors + F->first, (size_t)F->count, sizeof *p->tensors, out_tensor_name_cmp);
        uint64_t at = 0;
        for (int i = F->first; i < F->first + F->count; i++) {
            p->tensors[i].begin = at;
            at += p->tensors[i].t->numel * p->elem;
        }
    }
    return 0;
}

/* The file's safetensors header, as proto's writer makes it (data offsets in file order). */
static char *file_header(const plan *p, const out_file *F, size_t *len, errbuf *err) {
    st_wtensor *t = calloc((size_t)F->count, sizeof *t);
    if (!t) return errf(err, "%s: out of memory building the header", F->name), NULL;
    for (int i = 0; i < F->count; i++) {
        const ckpt_tensor *c = p->tensors[F->first + i].t;
        t[i] = (st_wtensor){.name = c->name, .dtype = p->dtype, .ndim = c->ndim};
        for (int d = 0; d < c->ndim; d++) t[i].shape[d] = c->shape[d];
    }
    char *header = st_header(t, F->count, NULL, 0, len, F->name, err);
    free(t);
    return header;
}

/* fp32 -> bf16 over the buffer's first n floats, the results packed at its start (each
 * 2-byte result lands on bytes already read). */
static void bf16_in_place(unsigned char *buf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, buf + 4 * i, 4);
        uint16_t h = bf16_from_f32(v);
        memcpy(buf + 2 * i, &h, 2);
    }
}

/* ---- where the values come from ---- */

typedef struct merge_source merge_source;

/* A checkpoint's master sections (shards), or a base model with adapters merged in (merge). */
typedef struct feed {
    const source *shards;
    const merge_source *merge;
} feed;

static int read_merged(const merge_source *ms, const out_tensor *o, uint64_t first, uint64_t n,
                       float *dst, errbuf *err);

/* dst[n] = elements [first, first+n) of the output tensor o, as fp32. */
static int feed_read(const feed *fd, const out_tensor *o, uint64_t first, uint64_t n, float *dst,
                     piece_list *pieces, errbuf *err) {
    if (fd->merge) return read_merged(fd->merge, o, first, n, dst, err);
    return read_master(fd->shards, o->unit, o->t->offset + first, n, dst, pieces, err);
}

/* Writes one output file, each tensor streamed through buf. */
static int write_file(const plan *p, const feed *s, const out_file *F, const char *dir,
                      unsigned char *buf, size_t buf_bytes, piece_list *pieces, errbuf *err) {
    char path[PATH_BYTES];
    size_t header_len;
    if (path_join(path, PATH_BYTES, dir, F->name, err)) return -1;
    char *header = file_header(p, F, &header_len, err);
    if (!header) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int rc = fd < 0 ? errf(err, "%s: %s", path, strerror(errno))
                    : file_pwrite_full(fd, header, header_len, 0, path, err);
    uint64_t chunk = buf_bytes / sizeof(float);
    for (int i = F->first; rc == 0 && i < F->first + F->count; i++) {
        const out_tensor *o = &p->tensors[i];
        for (uint64_t first = 0; rc == 0 && first < o->t->numel; first += chunk) {
            uint64_t n = o->t->numel - first < chunk ? o->t->numel - first : chunk;
            rc = feed_read(s, o, first, n, (float *)buf, pieces, err);
            if (rc == 0 && p->dtype == ST_BF16) bf16_in_place(buf, (size_t)n);
            if (rc == 0)
                rc = file_pwrite_full(fd, buf, (size_t)(n * p->elem),
                                      (off_t)(header_len + o->begin + first * p->elem), path, err);
        }
    }
    if (rc == 0 && fsync(fd) != 0) rc = errf(err, "%s: fsync: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && rc == 0) rc = errf(err, "%s: close: %s", path, strerror(errno));
    free(header);
    return rc;
}

/* ---- the writer threads: each takes the next output file until none is left ---- */

typedef struct writer {
    const plan *p;
    const feed *s;
    const char *dir;
    size_t buf_bytes;
    atomic_int *next_file, *failed;
    piece_list pieces;
    int rc;
    errbuf err;
    pthread_t thread;
} writer;

static void *writer_main(void *arg) {
    writer *w = arg;
    unsigned char *buf = malloc(w->buf_bytes);
    if (!buf) w->rc = errf(&w->err, "%s: out of memory for a %zu-byte buffer", w->dir, w->buf_bytes);
    while (w->rc == 0 && !atomic_load(w->failed)) {
        int f = atomic_fetch_add(w->next_file, 1);
        if (f >= w->p->n_files) break;
        w->rc = write_file(w->p, w->s, &w->p->files[f], w->dir, buf, w->buf_bytes, &w->pieces, &w->err);
    }
    if (w->rc) atomic_store(w->failed, 1);
    free(buf);
    return NULL;
}

/* Writes every safetensors file with up to `threads` threads, then checks the CRCs of the
 * checkpoint's sections read. */
static int write_weights(const plan *p, const feed *s, const char *dir, int threads,
                         size_t buf_bytes, errbuf *err) {
    int n = threads < p->n_files ? threads : p->n_files, started = 0, rc = 0;
    atomic_int next_file = 0, failed = 0;
    writer *w = calloc((size_t)n, sizeof *w);
    if (!w) return errf(err, "%s: out of memory", dir);
    for (; started < n; started++) {
        w[started] = (writer){.p = p, .s = s, .dir = dir, .buf_bytes = buf_bytes,
                              .next_file = &next_file, .failed = &failed};
        int e = pthread_create(&w[started].thread, NULL, writer_main, &w[started]);
        if (e) {
            atomic_store(&failed, 1);
            rc = errf(err, "%s: cannot start a writer thread: %s", dir, strerror(e));
            break;
        }
    }
    size_t total = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(w[i].thread, NULL);
        if (w[i].rc && rc == 0) rc = (*err = w[i].err, -1);
        total += w[i].pieces.n;
    }
    piece *all = rc == 0 ? malloc((total ? total : 1) * sizeof *all) : NULL;
    if (rc == 0 && !all) rc = errf(err, "%s: out of memory", dir);
    for (size_t i = 0, at = 0; i < (size_t)started; i++) {
        if (all && w[i].pieces.n) memcpy(all + at, w[i].pieces.v, w[i].pieces.n * sizeof *all);
        at += w[i].pieces.n;
        free(w[i].pieces.v);
    }
    free(w);
    if (rc == 0 && s->shards) rc = check_master_crcs(s->shards, all, total, err);
    free(all);
    return rc;
}

/* ---- the small files ---- */

/* The names written into the partial directory, for the commit. */
typedef struct name_list {
    int n;
    char (*v)[NAME_BYTES];
} name_list;

static int name_add(name_list *l, const char *name, errbuf *err) {
    char(*bigger)[NAME_BYTES] = realloc(l->v, ((size_t)l->n + 1) * sizeof *bigger);
    if (!bigger) return errf(err, "out of memory");
    l->v = bigger;
    snprintf(l->v[l->n++], NAME_BYTES, "%s", name);
    return 0;
}

/* dir/name = root as indented JSON with sorted keys (as transformers writes its files). */
static int write_json(const char *dir, const char *name, json_t *root, name_list *names, errbuf *err) {
    char path[PATH_BYTES];
    if (path_join(path, PATH_BYTES, dir, name, err)) return -1;
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    if (!text) return errf(err, "%s: out of memory", path);
    file_chunk chunks[] = {{text, strlen(text)}, {"\n", 1}};
    int rc = file_write_atomic(path, chunks, 2, err);
    free(text);
    return rc ? -1 : name_add(names, name, err);
}

static int write_index(const plan *p, const char *dir, name_list *names, errbuf *err) {
    int n = 0;
    for (int f = 0; f < p->n_files; f++) n += p->files[f].count;
    const char **tensor_names = calloc((size_t)n, sizeof *tensor_names);
    const char **file_names = calloc((size_t)n, sizeof *file_names);
    json_t *root = NULL;
    for (int f = 0, k = 0; tensor_names && file_names && f < p->n_files; f++)
        for (int i = p->files[f].first; i < p->files[f].first + p->files[f].count; i++, k++)
            tensor_names[k] = p->tensors[i].t->name, file_names[k] = p->files[f].name;
    if (tensor_names && file_names) root = st_index_json(tensor_names, file_names, n, p->total_bytes);
    int rc = write_json(dir, ST_INDEX_NAME, root, names, err);
    json_decref(root);
    free(tensor_names);
    free(file_names);
    return rc;
}

/* config.json: the checkpoint's model config, with the dtype of these weights; a config
 * without model_type is Llama's, and one without architectures gets its family's class (a
 * job's model.config need not say: AutoModel loads the class architectures names). */
static int write_config(const json_t *model_config, st_dtype dtype, const char *dir, name_list *names,
                        errbuf *err) {
    json_t *c = json_deep_copy(model_config);
    const char *name = dtype == ST_BF16 ? "bfloat16" : "float32";
    int failed = !c || json_object_set_new(c, "dtype", json_string(name));
    if (!failed && json_object_get(c, "torch_dtype")) /* the older spelling, kept consistent */
        failed = json_object_set_new(c, "torch_dtype", json_string(name));
    if (!failed && !json_object_get(c, "model_type")) /* AutoConfig needs it */
        failed = json_object_set_new(c, "model_type", json_string("llama"));
    const char *type = c ? json_string_value(json_object_get(c, "model_type")) : NULL;
    llama_family family;
    if (!failed && llama_family_of(type, &family)) {
        errf(err, "%s: the checkpoint's model_type \"%s\" is none of ours", dir, type);
        json_decref(c);
        return -1;
    }
    if (!failed && !json_object_get(c, "architectures"))
        failed = json_object_set_new(c, "architectures", json_pack("[s]", llama_family_architecture(family)));
    int rc = failed ? errf(err, "%s: out of memory", dir) : write_json(dir, CONFIG_NAME, c, names, err);
    json_decref(c);
    return rc;
}

/* Copies `name` from the source model directory when it has it; 1 when it does not. */
static int copy_from_source(const char *from, const char *name, const char *dir, name_list *names,
                            errbuf *err) {
    char src[PATH_BYTES], dst[PATH_BYTES];
    if (path_join(src, PATH_BYTES, from, name, err) || path_join(dst, PATH_BYTES, dir, name, err)) return -1;
    int rc = file_copy(src, dst, err);
    return rc == 0 ? name_add(names, name, err) : rc;
}

/* generation_config.json: the source model's, else what transformers derives from the config. */
static int write_generation_config(const json_t *model_config, const char *from, const char *dir,
                                   name_list *names, errbuf *err) {
    int rc = from ? copy_from_source(from, GENERATION_NAME, dir, names, err) : 1;
    if (rc <= 0) return rc;
    static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    json_t *g = json_pack("{s:b}", "_from_model_config", 1);
    for (size_t i = 0; g && i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(model_config, keys[i]);
        if (v && !json_is_null(v) && json_object_set(g, keys[i], v)) g = (json_decref(g), NULL);
    }
    rc = write_json(dir, GENERATION_NAME, g, names, err);
    json_decref(g);
    return rc;
}

static int copy_tokenizer(const char *from, const char *dir, name_list *names, int *copied, errbuf *err) {
    struct stat st;
    *copied = 0;
    if (stat(from, &st) != 0) return errf(err, "%s: %s", from, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return errf(err, "%s: not a directory", from);
    for (size_t i = 0; i < HF_TOKENIZER_FILES; i++) {
        int rc = copy_from_source(from, hf_tokenizer_files[i], dir, names, err);
        if (rc < 0) return -1;
        *copied += rc == 0;
    }
    return 0;
}

/* ---- the output directory ---- */

/* Removes a directory and everything in it (a partial output, a stale merged/); a missing one
 * is fine. */
static int remove_tree(const char *dir, errbuf *err) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : errf(err, "%s: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) continue;
        char sub[PATH_BYTES];
        if (errno != EISDIR) rc = errf(err, "%s/%s: cannot remove: %s", dir, e->d_name, strerror(errno));
        else rc = path_join(sub, PATH_BYTES, dir, e->d_name, err) ? -1 : remove_tree(sub, err);
    }
    closedir(d);
    if (rc == 0 && rmdir(dir) != 0) rc = errf(err, "%s: rmdir: %s", dir, strerror(errno));
    return rc;
}

/* A fresh, empty partial directory (a stale one from an interrupted run removed). */
static int start_partial(const char *partial, errbuf *err) {
    return remove_tree(partial, err) || file_mkdir(partial, err) ? -1 : 0;
}

/* model.safetensors, its index, a model-NNNNN-of-NNNNN.safetensors shard, or an adapter's
 * weights. */
static int is_weight_name(const char *name) {
    int a, b, end = 0;
    if (!strcmp(name, ST_SINGLE_NAME) || !strcmp(name, ST_INDEX_NAME) || !strcmp(name, PEFT_WEIGHTS_NAME))
        return 1;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &end) == 2 &&
           (size_t)end == strlen(name);
}

static int unlink_if_present(const char *dir, const char *name, errbuf *err) {
    char path[PATH_BYTES];
    if (path_join(path, PATH_BYTES, dir, name, err)) return -1;
    return unlink(path) != 0 && errno != ENOENT ? errf(err, "%s: unlink: %s", path, strerror(errno)) : 0;
}

/* An existing OUT: no config.json or adapter_config.json while the weights change; stale
 * weight files (and, for an adapter, a stale merged/) removed; the new files moved in, the
 * marker (config.json or adapter_config.json) last. */
static int move_into(const char *partial, const char *out, const name_list *names,
                     const char *marker, errbuf *err) {
    char path[PATH_BYTES];
    if (unlink_if_present(out, CONFIG_NAME, err) || unlink_if_present(out, PEFT_CONFIG_NAME, err))
        return -1;
    if (!strcmp(marker, PEFT_CONFIG_NAME) &&
        (path_join(path, PATH_BYTES, out, MERGED_NAME, err) || remove_tree(path, err)))
        return -1;
    DIR *d = opendir(out);
    if (!d) return errf(err, "%s: %s", out, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;)
        if (is_weight_name(e->d_name)) rc = unlink_if_present(out, e->d_name, err);
    closedir(d);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; rc == 0 && i < names->n; i++) {
            if ((strcmp(names->v[i], marker) == 0) != (pass == 1)) continue;
            char from[PATH_BYTES], to[PATH_BYTES];
            if (path_join(from, PATH_BYTES, partial, names->v[i], err) || path_join(to, PATH_BYTES, out, names->v[i], err)) return -1;
            if (rename(from, to) != 0) rc = errf(err, "%s: rename to %s: %s", from, to, strerror(errno));
        }
    if (rc == 0) rc = file_fsync_dir(out, 1, err);
    if (rc == 0 && rmdir(partial) != 0) rc = errf(err, "%s: rmdir: %s", partial, strerror(errno));
    return rc;
}

static int commit(const char *partial, const char *out, const name_list *names, const char *marker,
                  errbuf *err) {
    struct stat st;
    if (file_fsync_dir(partial, 1, err)) return -1;
    if (stat(out, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return errf(err, "%s: exists and is not a directory", out);
        if (move_into(partial, out, names, marker, err)) return -1;
    } else if (errno != ENOENT) {
        return errf(err, "%s: %s", out, strerror(errno));
    } else if (rename(partial, out) != 0) {
        return errf(err, "%s: rename to %s: %s", partial, out, strerror(errno));
    }
    return file_fsync_dir(out, 0, err);
}

/* ---- the settings both entry points share ---- */

typedef struct out_settings {
    st_dtype dtype;
    uint64_t shard_bytes;
    int threads;
    size_t buf_bytes;
} out_settings;

static int check_settings(const char *who, st_dtype dtype, int threads, uint64_t shard_bytes,
                          size_t buffer_bytes, out_settings *os, errbuf *err) {
    if (dtype != ST_BF16 && dtype != ST_F32)
        return errf(err, "%s: dtype %s (bf16 or f32 only)", who, st_dtype_name(dtype));
    if (threads < 1 || threads > MAX_THREADS)
        return errf(err, "%s: %d threads (1 to %d)", who, threads, MAX_THREADS);
    if (shard_bytes < 1) return errf(err, "%s: a shard size of 0 bytes", who);
    if (buffer_bytes % sizeof(float) || buffer_bytes > SIZE_MAX / 2)
        return errf(err, "%s: a buffer of %zu bytes (a multiple of 4)", who, buffer_bytes);
    *os = (out_settings){dtype, shard_bytes, threads, buffer_bytes ? buffer_bytes : CONSOLIDATE_BUFFER};
    return 0;
}

/* OUT without trailing slashes, and OUT.partial. */
static int output_paths(const char *out, char *final, char *partial, errbuf *err) {
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') len--;
    if (len + sizeof ".partial" > PATH_BYTES) return errf(err, "%s: path too long", out);
    memcpy(final, out, len);
    final[len] = '\0';
    memcpy(partial, out, len);
    memcpy(partial + len, ".partial", sizeof ".partial");
    return 0;
}

static void note_tokenizer(consolidate_result *r, const char *from, int copied) {
    if (!r) return;
    r->tokenizer_files = copied;
    snprintf(r->tokenizer_source, sizeof r->tokenizer_source, "%s", from ? from : "");
}

/* The files of a model directory after its weights: the index (sharded weights), the
 * tokenizer files and generation_config.json from `from` (may be NULL), config.json. */
static int write_model_files(const plan *p, const json_t *model_config, const char *from,
                             const char *dir, name_list *names, consolidate_result *r, errbuf *err) {
    int copied = 0;
    for (int f = 0; f < p->n_files; f++)
        if (name_add(names, p->files[f].name, err)) return -1;
    if (strcmp(p->files[0].name, ST_SINGLE_NAME) != 0 && write_index(p, dir, names, err)) return -1;
    if (from && copy_tokenizer(from, dir, names, &copied, err)) return -1;
    note_tokenizer(r, from, copied);
    if (write_generation_config(model_config, from, dir, names, err)) return -1;
    return write_config(model_config, p->dtype, dir, names, err);
}

/* ---- merging: a base model's weights with W + scale * B A for every adapted weight ---- */

struct merge_source {
    st_model base;
    int base_open;
    llama_layout model;
    ckpt_layout layout;        /* the model's tensors as units, for the plan */
    const st_tensor **tensors; /* [layout.n_tensors]: each one's in base */
    const lora_layout *lo;
    const float *const *units;
    float scale;
};

static void merge_source_close(merge_source *ms) {
    if (ms->base_open) st_model_close(&ms->base);
    llama_layout_free(&ms->model);
    ckpt_layout_free(&ms->layout);
    free(ms->tensors);
}

/* A base tensor as bitsandbytes stores an NF4 weight (uint8 codes and their .absmax). */
static int refuse_quantized(const st_model *st, const llama_tensor_slot *slot, errbuf *err) {
    char name[ST_MAX_NAME + 16];
    const st_tensor *t = st_model_find(st, slot->name);
    snprintf(name, sizeof name, "%s.absmax", slot->name);
    if ((t && t->dtype == ST_U8) || st_model_find(st, name))
        return errf(err, "%s: tensor %s is quantized (bitsandbytes NF4): merging into a quantized "
                         "base is not built yet (merge into the unquantized model)", st->dir, slot->name);
    return 0;
}

/* The base is the one the adapters were trained on: its st_model_fingerprint. */
static int check_fingerprint(const st_model *st, const char *want, errbuf *err) {
    char have[ST_FINGERPRINT_HEX];
    st_model_fingerprint(st, have);
    if (strcmp(have, want) != 0)
        return errf(err, "%s: not the base model the adapters were trained on (fingerprint %.16s..., "
                         "the checkpoint's %.16s...)", st->dir, have, want);
    return 0;
}

static int merge_source_open(merge_source *ms, const char *model_dir, const llama_config *mcfg,
                             const lora_layout *lo, const float *const *units,
                             const char *fingerprint, errbuf *err) {
    *ms = (merge_source){.lo = lo, .units = units, .scale = (float)lora_scale(&lo->cfg)};
    if (st_model_open(&ms->base, model_dir, err)) return -1;
    ms->base_open = 1;
    const llama_layout *L = &ms->model;
    int rc = fingerprint ? check_fingerprint(&ms->base, fingerprint, err) : 0;
    if (rc == 0) rc = llama_layout_init(&ms->model, mcfg, err);
    if (rc == 0) rc = ckpt_layout_from_slots(&ms->layout, 1, L->units, L->n_units, L->tensors, L->n_tensors, err);
    if (rc == 0 && !(ms->tensors = calloc((size_t)L->n_tensors, sizeof *ms->tensors)))
        rc = errf(err, "%s: out of memory", model_dir);
    for (int i = 0; rc == 0 && i < L->n_tensors; i++) {
        rc = refuse_quantized(&ms->base, &L->tensors[i], err);
        if (rc == 0 && !(ms->tensors[i] = llama_checkpoint_tensor(&L->tensors[i], &ms->base, err))) rc = -1;
    }
    if (rc) merge_source_close(ms);
    return rc;
}

/* dst[j] += scale * (B A)[first + j], j < n, for module m of layer l, whose weight is
 * [out, in]: PEFT's W + (B @ A) * scaling, each row of B A summed in fp32 into `row`. */
static void add_delta(const merge_source *ms, int l, int m, uint64_t first, uint64_t n,
                      float *dst, float *restrict row) {
    const lora_site *s = &ms->lo->site[m];
    const float *A = ms->units[l] + s->a_off, *B = ms->units[l] + s->b_off;
    uint64_t in = (uint64_t)s->in, r = (uint64_t)ms->lo->cfg.rank;
    for (uint64_t e = first; e < first + n;) {
        uint64_t i = e / in, c0 = e % in, c1 = in < c0 + (first + n - e) ? in : c0 + (first + n - e);
        memset(row + c0, 0, (size_t)(c1 - c0) * sizeof *row);
        for (uint64_t k = 0; k < r; k++) {
            const float b = B[i * r + k], *restrict a = A + k * in;
            for (uint64_t c = c0; c < c1; c++) row[c] += b * a[c];
        }
        for (uint64_t c = c0; c < c1; c++) dst[i * in + c - first] += row[c] * ms->scale;
        e += c1 - c0;
    }
}

static int read_merged(const merge_source *ms, const out_tensor *o, uint64_t first, uint64_t n,
                       float *dst, errbuf *err) {
    int i = (int)(o->t - ms->layout.tensors), l = o->unit - 1;
    int m = i - ms->layout.units[o->unit].first;
    if (st_read_f32(ms->tensors[i], (size_t)first, (size_t)n, dst, err) ||
        st_check_finite(dst, (size_t)n, (size_t)first, ms->base.dir, o->t->name,
                        "a non-finite base is refused", err))
        return -1;
    if (l < 0 || l >= ms->lo->n_layers || m >= LORA_MODULES || !ms->lo->site[m].on) return 0;
    float *row = malloc((size_t)ms->lo->site[m].in * sizeof *row);
    if (!row) return errf(err, "%s: out of memory", o->t->name);
    add_delta(ms, l, m, first, n, dst, row);
    free(row);
    return st_check_finite(dst, (size_t)n, (size_t)first, "merged", o->t->name,
                           "the base plus the adapter's scaled B A overflows fp32", err);
}

/* What a merged model is made of. */
typedef struct merge_input {
    const char *model_dir;      /* the base's weights */
    const json_t *model_config; /* its config.json object */
    const llama_config *mcfg;
    const lora_layout *lo;
    const float *const *units;
    const char *fingerprint;    /* the base's, checked; NULL: not checked */
    const char *from;           /* tokenizer files and generation_config.json; may be NULL */
} merge_input;

/* The merged model as a whole model directory in dir; *files, *tensors, *bytes: its weights. */
static int write_merged(const merge_input *in, const out_settings *os, const char *dir,
                        name_list *names, consolidate_result *r, int *files, int *tensors,
                        uint64_t *bytes, errbuf *err) {
    merge_source ms;
    plan p;
    if (merge_source_open(&ms, in->model_dir, in->mcfg, in->lo, in->units, in->fingerprint, err))
        return -1;
    int rc = plan_build(&p, &ms.layout, os->dtype, os->shard_bytes, ST_SINGLE_NAME, err);
    if (rc == 0) {
        feed fd = {.merge = &ms};
        rc = write_weights(&p, &fd, dir, os->threads, os->buf_bytes, err);
        if (rc == 0) rc = write_model_files(&p, in->model_config, in->from, dir, names, r, err);
        *files = p.n_files;
        *tensors = p.n_tensors;
        *bytes = p.total_bytes;
        plan_free(&p);
    }
    merge_source_close(&ms);
    return rc;
}

/* ---- the whole ---- */

/* The step directory: ckpt itself when it holds a manifest, else what ckpt/latest names. */
static int resolve_checkpoint(const char *ckpt, char *step_dir, errbuf *err) {
    char path[PATH_BYTES];
    struct stat st;
    if (stat(ckpt, &st) != 0) return errf(err, "%s: %s", ckpt, strerror(errno));
    if (path_join(path, PATH_BYTES, ckpt, CKPT_MANIFEST, err)) return -1;
    if (stat(path, &st) == 0) return snprintf(step_dir, PATH_BYTES, "%s", ckpt) < 0 ? -1 : 0;
    if (path_join(path, PATH_BYTES, ckpt, CKPT_LATEST, err)) return -1;
    if (lstat(path, &st) != 0)
        return errf(err, "%s: not a checkpoint: no %s, and no %s to follow", ckpt, CKPT_MANIFEST,
                    CKPT_LATEST);
    return ckpt_resolve(ckpt, JOB_RESUME_LATEST, 0, step_dir, PATH_BYTES, err) < 0 ? -1 : 0;
}

/* Where the tokenizer files and generation_config.json come from: tokenizer_from, else the
 * model directory the manifest records (none for a job of init random).  A recorded
 * directory that is no longer there is a warning, not an error: the weights need nothing
 * from it, and tokenizer_from can name another copy. */
static const char *model_source(const consolidate_options *o, const ckpt_manifest *m) {
    struct stat st;
    if (o->tokenizer_from) return o->tokenizer_from;
    if (!m->model_path[0]) return NULL;
    int found = stat(m->model_path, &st) == 0;
    if (found && S_ISDIR(st.st_mode)) return m->model_path;
    if (o->result)
        snprintf(o->result->warning, sizeof o->result->warning,
                 "%s (the checkpoint's model directory): %s: no tokenizer files copied "
                 "(--tokenizer-from names another copy)",
                 m->model_path, found ? "not a directory" : strerror(errno));
    return NULL;
}

static void note_weights(consolidate_result *r, const plan *p) {
    if (!r) return;
    r->files = p->n_files;
    r->tensors = p->n_tensors;
    r->bytes = p->total_bytes;
}

/* A full fine-tune's checkpoint: the model directory, into the partial directory. */
static int write_model(const consolidate_options *o, const out_settings *os, const ckpt_manifest *m,
                       const source *s, const char *partial, name_list *names, errbuf *err) {
    plan p;
    if (plan_build(&p, &m->layout, os->dtype, os->shard_bytes, ST_SINGLE_NAME, err)) return -1;
    feed fd = {.shards = s};
    note_weights(o->result, &p);
    int rc = write_weights(&p, &fd, partial, os->threads, os->buf_bytes, err);
    if (rc == 0) rc = write_model_files(&p, m->model_config, model_source(o, m), partial, names, o->result, err);
    plan_free(&p);
    return rc;
}

/* The manifest's units are the adapters lora_layout lays out for its model and settings (so
 * adapter_config.json describes the weights written). */
static int check_adapter_layout(const ckpt_manifest *m, const lora_layout *lo, errbuf *err) {
    const ckpt_layout *c = &m->layout;
    if (c->n_units != lo->n_units || c->n_tensors != lo->n_tensors)
        return errf(err, "the manifest's adapter: %d units and %d tensors, its settings lay out %d and %d",
                    c->n_units, c->n_tensors, lo->n_units, lo->n_tensors);
    for (int i = 0; i < lo->n_tensors; i++) {
        const ckpt_tensor *t = &c->tensors[i];
        const llama_tensor_slot *s = &lo->tensors[i];
        if (strcmp(t->name, s->name) || t->offset != s->offset || t->numel != s->numel ||
            t->shape[0] != s->shape[0] || t->shape[1] != s->shape[1])
            return errf(err, "the manifest's adapter: tensor %d is %s (offset %llu), its settings lay "
                             "out %s (offset %zu)", i, t->name, (unsigned long long)t->offset, s->name, s->offset);
    }
    return 0;
}

/* OUT/merged from the adapter just written into partial (read back as a PEFT directory) and
 * the base the manifest records, its fingerprint checked. */
static int write_merged_of_checkpoint(const consolidate_options *o, const out_settings *os,
                                      const ckpt_manifest *m, const llama_config *mcfg,
                                      const char *partial, const char *from, name_list *names,
                                      errbuf *err) {
    char dir[PATH_BYTES];
    lora_layout lo;
    float **units;
    name_list inner = {0, NULL};
    consolidate_result *r = o->result;
    int files, tensors;
    uint64_t bytes;
    if (!m->model_path[0])
        return errf(err, "merge: the checkpoint records no base model directory (model_path)");
    if (path_join(dir, PATH_BYTES, partial, MERGED_NAME, err) || file_mkdir(dir, err) ||
        peft_load(partial, mcfg, &lo, &units, err))
        return -1;
    merge_input in = {m->model_path, m->model_config, mcfg, &lo, (const float *const *)units,
                      m->adapter.base_fingerprint, from};
    int rc = write_merged(&in, os, dir, &inner, NULL, &files, &tensors, &bytes, err);
    if (rc == 0) rc = file_fsync_dir(dir, 1, err) || name_add(names, MERGED_NAME, err) ? -1 : 0;
    if (rc == 0 && r) r->merged_files = files, r->merged_tensors = tensors, r->merged_bytes = bytes;
    free(inner.v);
    peft_units_free(units, lo.n_units);
    lora_layout_free(&lo);
    return rc;
}

/* An adapter job's checkpoint: a PEFT adapter directory (and merged/), into the partial
 * directory. */
static int write_adapter(const consolidate_options *o, const out_settings *os, const ckpt_manifest *m,
                         const source *s, const char *partial, name_list *names, errbuf *err) {
    llama_config mcfg;
    lora_layout lo;
    plan p;
    char path[PATH_BYTES];
    int copied = 0;
    if (llama_config_from_json(&mcfg, m->model_config, "the manifest's model_config", err) ||
        lora_layout_init(&lo, &mcfg, &m->adapter.lora, err))
        return -1;
    int rc = check_adapter_layout(m, &lo, err);
    lora_layout_free(&lo);
    if (rc || plan_build(&p, &m->layout, o->adapter_dtype, UINT64_MAX, PEFT_WEIGHTS_NAME, err)) return -1;
    feed fd = {.shards = s};
    const char *from = model_source(o, m);
    note_weights(o->result, &p);
    rc = write_weights(&p, &fd, partial, os->threads, os->buf_bytes, err);
    plan_free(&p);
    if (rc || name_add(names, PEFT_WEIGHTS_NAME, err)) return -1;
    if (from && copy_tokenizer(from, partial, names, &copied, err)) return -1;
    note_tokenizer(o->result, from, copied);
    if (path_join(path, PATH_BYTES, partial, PEFT_CONFIG_NAME, err) ||
        peft_write_config(path, &m->adapter.lora, m->model_path, err) ||
        name_add(names, PEFT_CONFIG_NAME, err))
        return -1;
    return o->merge ? write_merged_of_checkpoint(o, os, m, &mcfg, partial, from, names, err) : 0;
}

int consolidate(const consolidate_options *o, errbuf *err) {
    double start = clock_now_s();
    if (o->result) memset(o->result, 0, sizeof *o->result);
    char step_dir[PATH_BYTES], out[PATH_BYTES], partial[PATH_BYTES];
    out_settings os;
    if (check_settings("consolidate", o->dtype, o->threads, o->shard_bytes, o->buffer_bytes, &os, err))
        return -1;
    if (o->adapter_dtype != ST_BF16 && o->adapter_dtype != ST_F32)
        return errf(err, "consolidate: adapter dtype %s (bf16 or f32 only)", st_dtype_name(o->adapter_dtype));
    if (!o->ckpt || !o->out || !o->out[0]) return errf(err, "consolidate: no checkpoint or output");
    if (resolve_checkpoint(o->ckpt, step_dir, err) || output_paths(o->out, out, partial, err)) return -1;
    ckpt_manifest m;
    source s;
    if (ckpt_manifest_load(&m, step_dir, err)) return -1;
    if (o->merge && !m.has_adapter) {
        ckpt_manifest_free(&m);
        return errf(err, "%s: a full fine-tune's checkpoint: there is no adapter to merge", step_dir);
    }
    if (source_open(&s, step_dir, &m, err)) {
        ckpt_manifest_free(&m);
        return -1;
    }
    name_list names = {0, NULL};
    int rc = start_partial(partial, err);
    if (rc == 0)
        rc = m.has_adapter ? write_adapter(o, &os, &m, &s, partial, &names, err)
                           : write_model(o, &os, &m, &s, partial, &names, err);
    if (rc == 0) rc = commit(partial, out, &names, m.has_adapter ? PEFT_CONFIG_NAME : CONFIG_NAME, err);
    if (rc) remove_tree(partial, NULL);
    free(names.v);
    if (o->result) {
        consolidate_result *r = o->result;
        snprintf(r->ckpt, sizeof r->ckpt, "%s", step_dir);
        r->step = m.step;
        r->adapter = m.has_adapter;
        r->seconds = clock_now_s() - start;
    }
    source_close(&s);
    ckpt_manifest_free(&m);
    return rc;
}

/* ---- fsdpctl merge: a base model directory and a PEFT adapter directory ---- */

/* MODEL_DIR/config.json: the object (for config.json) and the config it describes. */
static json_t *load_model_config(const char *model_dir, llama_config *mcfg, errbuf *err) {
    char path[PATH_BYTES];
    json_error_t je;
    if (path_join(path, PATH_BYTES, model_dir, CONFIG_NAME, err)) return NULL;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errf(err, "%s: line %d: %s", path, je.line, je.text), NULL;
    if (llama_config_from_json(mcfg, root, path, err)) root = (json_decref(root), NULL);
    return root;
}

int consolidate_merge(const merge_options *o, errbuf *err) {
    double start = clock_now_s();
    if (o->result) memset(o->result, 0, sizeof *o->result);
    char out[PATH_BYTES], partial[PATH_BYTES];
    out_settings os;
    llama_config mcfg;
    lora_layout lo;
    float **units;
    if (check_settings("merge", o->dtype, o->threads, o->shard_bytes, o->buffer_bytes, &os, err)) return -1;
    if (!o->model_dir || !o->adapter_dir || !o->out || !o->out[0])
        return errf(err, "merge: no model, adapter or output directory");
    if (output_paths(o->out, out, partial, err)) return -1;
    json_t *config = load_model_config(o->model_dir, &mcfg, err);
    if (!config) return -1;
    if (peft_load(o->adapter_dir, &mcfg, &lo, &units, err)) {
        json_decref(config);
        return -1;
    }
    name_list names = {0, NULL};
    merge_input in = {o->model_dir, config, &mcfg, &lo, (const float *const *)units, NULL, o->model_dir};
    consolidate_result scratch = {0}, *r = o->result ? o->result : &scratch;
    int rc = start_partial(partial, err);
    if (rc == 0) rc = write_merged(&in, &os, partial, &names, r, &r->files, &r->tensors, &r->bytes, err);
    if (rc == 0) rc = commit(partial, out, &names, CONFIG_NAME, err);
    if (rc) remove_tree(partial, NULL);
    r->seconds = clock_now_s() - start;
    free(names.v);
    peft_units_free(units, lo.n_units);
    lora_layout_free(&lo);
    json_decref(config);
    return rc;
}
