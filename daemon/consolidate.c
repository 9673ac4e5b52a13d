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

#define NAME_BYTES 64
#define CONFIG_NAME "config.json"
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
        s->fds[f] = open(path, O_RDONLY | O_CLOEXEC);
        if (s->fds[f] < 0) {
            errf(err, "%s: %s", path, strerror(errno));
            goto fail;
        }
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
 * them out back to back. */
static int plan_build(plan *p, const ckpt_layout *lo, st_dtype dtype, uint64_t shard_bytes,
                      errbuf *err) {
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
        if (p->total_bytes <= shard_bytes) snprintf(F->name, sizeof F->name, ST_SINGLE_NAME);
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

/* Writes one output file, each tensor streamed through buf. */
static int write_file(const plan *p, const source *s, const out_file *F, const char *dir,
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
            rc = read_master(s, o->unit, o->t->offset + first, n, (float *)buf, pieces, err);
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
    const source *s;
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

/* Writes every safetensors file with up to `threads` threads, then checks the CRCs. */
static int write_weights(const plan *p, const source *s, const char *dir, int threads,
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
    if (rc == 0) rc = check_master_crcs(s, all, total, err);
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

/* config.json: the checkpoint's model config, with the dtype of these weights. */
static int write_config(const json_t *model_config, st_dtype dtype, const char *dir, name_list *names,
                        errbuf *err) {
    json_t *c = json_deep_copy(model_config);
    const char *name = dtype == ST_BF16 ? "bfloat16" : "float32";
    int failed = !c || json_object_set_new(c, "dtype", json_string(name));
    if (!failed && json_object_get(c, "torch_dtype")) /* the older spelling, kept consistent */
        failed = json_object_set_new(c, "torch_dtype", json_string(name));
    if (!failed && !json_object_get(c, "model_type")) /* AutoConfig needs it */
        failed = json_object_set_new(c, "model_type", json_string("llama"));
    if (!failed && !json_object_get(c, "architectures"))
        failed = json_object_set_new(c, "architectures", json_pack("[s]", "LlamaForCausalLM"));
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

/* Removes a directory of plain files (a partial output); a missing one is fine. */
static int remove_partial(const char *dir, errbuf *err) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : errf(err, "%s: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0)
            rc = errf(err, "%s/%s: cannot remove: %s", dir, e->d_name, strerror(errno));
    }
    closedir(d);
    if (rc == 0 && rmdir(dir) != 0) rc = errf(err, "%s: rmdir: %s", dir, strerror(errno));
    return rc;
}

/* model.safetensors, its index, or a model-NNNNN-of-NNNNN.safetensors shard. */
static int is_weight_name(const char *name) {
    int a, b, end = 0;
    if (!strcmp(name, ST_SINGLE_NAME) || !strcmp(name, ST_INDEX_NAME)) return 1;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &end) == 2 &&
           (size_t)end == strlen(name);
}

static int unlink_if_present(const char *dir, const char *name, errbuf *err) {
    char path[PATH_BYTES];
    if (path_join(path, PATH_BYTES, dir, name, err)) return -1;
    return unlink(path) != 0 && errno != ENOENT ? errf(err, "%s: unlink: %s", path, strerror(errno)) : 0;
}

/* An existing OUT: no config.json while the weights change; stale weight files removed; the
 * new files moved in, config.json last. */
static int move_into(const char *partial, const char *out, const name_list *names, errbuf *err) {
    if (unlink_if_present(out, CONFIG_NAME, err)) return -1;
    DIR *d = opendir(out);
    if (!d) return errf(err, "%s: %s", out, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;)
        if (is_weight_name(e->d_name)) rc = unlink_if_present(out, e->d_name, err);
    closedir(d);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; rc == 0 && i < names->n; i++) {
            if ((strcmp(names->v[i], CONFIG_NAME) == 0) != (pass == 1)) continue;
            char from[PATH_BYTES], to[PATH_BYTES];
            if (path_join(from, PATH_BYTES, partial, names->v[i], err) || path_join(to, PATH_BYTES, out, names->v[i], err)) return -1;
            if (rename(from, to) != 0) rc = errf(err, "%s: rename to %s: %s", from, to, strerror(errno));
        }
    if (rc == 0) rc = file_fsync_dir(out, 1, err);
    if (rc == 0 && rmdir(partial) != 0) rc = errf(err, "%s: rmdir: %s", partial, strerror(errno));
    return rc;
}

static int commit(const char *partial, const char *out, const name_list *names, errbuf *err) {
    struct stat st;
    if (file_fsync_dir(partial, 1, err)) return -1;
    if (stat(out, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return errf(err, "%s: exists and is not a directory", out);
        if (move_into(partial, out, names, err)) return -1;
    } else if (errno != ENOENT) {
        return errf(err, "%s: %s", out, strerror(errno));
    } else if (rename(partial, out) != 0) {
        return errf(err, "%s: rename to %s: %s", partial, out, strerror(errno));
    }
    return file_fsync_dir(out, 0, err);
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

static int check_options(const consolidate_options *o, errbuf *err) {
    if (o->dtype != ST_BF16 && o->dtype != ST_F32)
        return errf(err, "consolidate: dtype %s (bf16 or f32 only)", st_dtype_name(o->dtype));
    if (o->threads < 1 || o->threads > MAX_THREADS)
        return errf(err, "consolidate: %d threads (1 to %d)", o->threads, MAX_THREADS);
    if (o->shard_bytes < 1) return errf(err, "consolidate: a shard size of 0 bytes");
    if (o->buffer_bytes % sizeof(float) || o->buffer_bytes > SIZE_MAX / 2)
        return errf(err, "consolidate: a buffer of %zu bytes (a multiple of 4)", o->buffer_bytes);
    if (!o->ckpt || !o->out || !o->out[0]) return errf(err, "consolidate: no checkpoint or output");
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

/* Everything but the commit, into the partial directory. */
static int write_all(const consolidate_options *o, const ckpt_manifest *m, const source *s,
                     const plan *p, const char *partial, name_list *names, errbuf *err) {
    size_t buf_bytes = o->buffer_bytes ? o->buffer_bytes : CONSOLIDATE_BUFFER;
    int copied = 0;
    const char *from = model_source(o, m);
    if (remove_partial(partial, err) || file_mkdir(partial, err) ||
        write_weights(p, s, partial, o->threads, buf_bytes, err))
        return -1;
    for (int f = 0; f < p->n_files; f++)
        if (name_add(names, p->files[f].name, err)) return -1;
    if (strcmp(p->files[0].name, ST_SINGLE_NAME) != 0 && write_index(p, partial, names, err))
        return -1;
    if (from && copy_tokenizer(from, partial, names, &copied, err)) return -1;
    if (o->result) {
        o->result->tokenizer_files = copied;
        snprintf(o->result->tokenizer_source, sizeof o->result->tokenizer_source, "%s", from ? from : "");
    }
    if (write_generation_config(m->model_config, from, partial, names, err)) return -1;
    return write_config(m->model_config, o->dtype, partial, names, err);
}

int consolidate(const consolidate_options *o, errbuf *err) {
    double start = clock_now_s();
    if (o->result) memset(o->result, 0, sizeof *o->result);
    char step_dir[PATH_BYTES], out[PATH_BYTES], partial[PATH_BYTES];
    if (check_options(o, err) || resolve_checkpoint(o->ckpt, step_dir, err) ||
        output_paths(o->out, out, partial, err))
        return -1;
    ckpt_manifest m;
    source s;
    plan p;
    if (ckpt_manifest_load(&m, step_dir, err)) return -1;
    if (source_open(&s, step_dir, &m, err)) {
        ckpt_manifest_free(&m);
        return -1;
    }
    int rc = plan_build(&p, &m.layout, o->dtype, o->shard_bytes, err);
    if (rc == 0) {
        name_list names = {0, NULL};
        rc = write_all(o, &m, &s, &p, partial, &names, err);
        if (rc == 0) rc = commit(partial, out, &names, err);
        if (rc) remove_partial(partial, NULL);
        free(names.v);
        if (o->result) {
            consolidate_result *r = o->result;
            snprintf(r->ckpt, sizeof r->ckpt, "%s", step_dir);
            r->step = m.step;
            r->files = p.n_files;
            r->tensors = p.n_tensors;
            r->bytes = p.total_bytes;
            r->seconds = clock_now_s() - start;
        }
        plan_free(&p);
    }
    source_close(&s);
    ckpt_manifest_free(&m);
    return rc;
}
