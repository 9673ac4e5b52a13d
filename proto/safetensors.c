/* safetensors: the tensor file format read (mmap) and written, single and sharded; see safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/bytes.h"
#include "base/fileio.h"
#include "base/sha256.h"

#define ST_MAX_INDEX (16u << 20) /* model.safetensors.index.json: a 405B model's is ~100 KB */

/* ---------- dtypes ---------- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[ST_DTYPE_COUNT] = {
    [ST_F64] = {"F64", 8}, [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2},  [ST_BF16] = {"BF16", 2},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2},  [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},
};

static int dtype_valid(st_dtype d) { return (unsigned)d < ST_DTYPE_COUNT; }

size_t st_dtype_size(st_dtype d) { return dtype_valid(d) ? dtype_info[d].size : 0; }

const char *st_dtype_name(st_dtype d) { return dtype_valid(d) ? dtype_info[d].name : "?"; }

int st_dtype_parse(const char *s, st_dtype *out) {
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        if (strcmp(s, dtype_info[d].name) == 0) {
            *out = (st_dtype)d;
            return 0;
        }
    }
    return -1;
}

/* numel and byte size of a shape; -1 when a dimension is negative or the product overflows. */
static int shape_bytes(const int64_t *shape, int ndim, st_dtype dtype, uint64_t *numel,
                       uint64_t *nbytes) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return -1;
    }
    if (__builtin_mul_overflow(n, (uint64_t)st_dtype_size(dtype), nbytes)) return -1;
    *numel = n;
    return 0;
}

/* ---------- reader ---------- */

/* Where a tensor's bytes lie in the data area, for the coverage check. */
typedef struct span {
    uint64_t begin, end;
    int index;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* A JSON integer >= 0, or -1. */
static int64_t json_uint(const json_t *v) {
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    return i < 0 ? -1 : (int64_t)i;
}

static int parse_meta(st_file *f, const json_t *obj, const char *name, errbuf *err) {
    if (!json_is_object(obj)) return errf(err, "%s: __metadata__ is not an object", name);
    size_t n = json_object_size(obj);
    f->meta = calloc(n ? n : 1, sizeof *f->meta);
    if (!f->meta) return errf(err, "%s: out of memory for metadata", name);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (!json_is_string(v))
            return errf(err, "%s: __metadata__ value of '%s' is not a string", name, key);
        st_meta *m = &f->meta[f->n_meta];
        m->key = strdup(key);
        m->value = strdup(json_string_value(v));
        f->n_meta++;
        if (!m->key || !m->value) return errf(err, "%s: out of memory for metadata", name);
    }
    return 0;
}

/* Fills t from one header entry and returns its [begin, end) in *s. */
static int parse_entry(st_tensor *t, span *s, const char *key, const json_t *v,
                       uint64_t data_len, const char *name, errbuf *err) {
    size_t key_len = strlen(key);
    if (key_len == 0) return errf(err, "%s: tensor with an empty name", name);
    if (key_len >= ST_MAX_NAME)
        return errf(err, "%s: tensor name '%.64s...' longer than %d bytes", name, key,
                    ST_MAX_NAME - 1);
    memcpy(t->name, key, key_len + 1);
    if (!json_is_object(v)) return errf(err, "%s: tensor '%s': entry is not an object", name, key);

    const json_t *dtype = json_object_get(v, "dtype");
    const json_t *shape = json_object_get(v, "shape");
    const json_t *offsets = json_object_get(v, "data_offsets");
    if (!dtype) return errf(err, "%s: tensor '%s': missing dtype", name, key);
    if (!shape) return errf(err, "%s: tensor '%s': missing shape", name, key);
    if (!offsets) return errf(err, "%s: tensor '%s': missing data_offsets", name, key);
    if (!json_is_string(dtype) || st_dtype_parse(json_string_value(dtype), &t->dtype) < 0)
        return errf(err, "%s: tensor '%s': unknown dtype %s", name, key,
                    json_is_string(dtype) ? json_string_value(dtype) : "(not a string)");

    if (!json_is_array(shape)) return errf(err, "%s: tensor '%s': shape is not an array", name, key);
    if (json_array_size(shape) > ST_MAX_DIMS)
        return errf(err, "%s: tensor '%s': shape has %zu dimensions, more than %d", name, key,
                    json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int i = 0; i < t->ndim; i++) {
        t->shape[i] = json_uint(json_array_get(shape, i));
        if (t->shape[i] < 0)
            return errf(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", name,
                        key, i);
    }
    if (shape_bytes(t->shape, t->ndim, t->dtype, &t->numel, &t->nbytes) < 0)
        return errf(err, "%s: tensor '%s': shape size overflows", name, key);

    int64_t begin = json_uint(json_array_get(offsets, 0));
    int64_t end = json_uint(json_array_get(offsets, 1));
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || begin < 0 || end < 0)
        return errf(err, "%s: tensor '%s': data_offsets is not [begin, end] of non-negative integers",
                    name, key);
    if (begin > end)
        return errf(err, "%s: tensor '%s': data_offsets begin %lld > end %lld", name, key,
                    (long long)begin, (long long)end);
    if ((uint64_t)end > data_len)
        return errf(err, "%s: tensor '%s': data_offsets [%lld, %lld] out of range (data is %llu bytes)",
                    name, key, (long long)begin, (long long)end, (unsigned long long)data_len);
    if ((uint64_t)(end - begin) != t->nbytes)
        return errf(err, "%s: tensor '%s': %s shape needs %llu bytes but data_offsets span %lld",
                    name, key, st_dtype_name(t->dtype), (unsigned long long)t->nbytes,
                    (long long)(end - begin));
    s->begin = (uint64_t)begin;
    s->end = (uint64_t)end;
    return 0;
}

/* Sorts the tensors by offset and checks they tile the data area exactly. */
static int order_tensors(st_file *f, st_tensor *parsed, span *spans, const uint8_t *data,
                         uint64_t data_len, const char *name, errbuf *err) {
    qsort(spans, (size_t)f->n_tensors, sizeof *spans, span_cmp);
    uint64_t expected = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const char *tname = parsed[spans[i].index].name;
        if (spans[i].begin < expected)
            return errf(err, "%s: tensor '%s' overlaps tensor '%s'", name, tname,
                        parsed[spans[i - 1].index].name);
        if (spans[i].begin > expected)
            return errf(err, "%s: gap of %llu bytes before tensor '%s'", name,
                        (unsigned long long)(spans[i].begin - expected), tname);
        expected = spans[i].end;
    }
    if (expected != data_len)
        return errf(err, "%s: %llu trailing bytes after the last tensor", name,
                    (unsigned long long)(data_len - expected));
    for (int i = 0; i < f->n_tensors; i++) {
        f->tensors[i] = parsed[spans[i].index];
        f->tensors[i].data = data + spans[i].begin;
    }
    return 0;
}

static int parse_header(st_file *f, const json_t *root, const uint8_t *data, uint64_t data_len,
                        const char *name, errbuf *err) {
    size_t n = json_object_size(root);
    st_tensor *parsed = calloc(n ? n : 1, sizeof *parsed);
    span *spans = calloc(n ? n : 1, sizeof *spans);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    int rc = -1;
    if (!parsed || !spans || !f->tensors) {
        errf(err, "%s: out of memory for %zu tensors", name, n);
        goto out;
    }
    int count = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (parse_meta(f, v, name, err) < 0) goto out;
            continue;
        }
        if (parse_entry(&parsed[count], &spans[count], key, v, data_len, name, err) < 0) goto out;
        spans[count].index = count;
        count++;
    }
    f->n_tensors = count;
    rc = order_tensors(f, parsed, spans, data, data_len, name, err);
out:
    free(parsed);
    free(spans);
    return rc;
}

int st_parse(st_file *f, const void *buf, size_t len, const char *name, errbuf *err) {
    memset(f, 0, sizeof *f);
    const uint8_t *p = buf;
    if (len < 8) return errf(err, "%s: file is %zu bytes, shorter than the 8-byte header length", name, len);
    uint64_t n = le_get_u64(p);
    if (n == 0) return errf(err, "%s: header length is 0", name);
    if (n > ST_MAX_HEADER)
        return errf(err, "%s: header length %llu larger than the %u byte limit", name,
                    (unsigned long long)n, ST_MAX_HEADER);
    if (n > len - 8)
        return errf(err, "%s: header length %llu past end of file (%zu bytes)", name,
                    (unsigned long long)n, len);
    if (p[8] != '{') return errf(err, "%s: header does not start with '{'", name);

    f->path = strdup(name);
    if (!f->path) return errf(err, "%s: out of memory", name);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        errf(err, "%s: bad header JSON at byte %d: %s", name, jerr.position, jerr.text);
        st_close(f);
        return -1;
    }
    int rc = json_is_object(root)
                 ? parse_header(f, root, p + 8 + n, len - 8 - n, name, err)
                 : errf(err, "%s: header is not a JSON object", name);
    json_decref(root);
    if (rc < 0) st_close(f);
    return rc;
}

int st_open(st_file *f, const char *path, errbuf *err) {
    memset(f, 0, sizeof *f);
    void *map;
    size_t len;
    if (file_map_readonly(path, &map, &len, err) < 0) return -1;
    if (st_parse(f, map, len, path, err) < 0) {
        if (map) munmap(map, len);
        return -1;
    }
    f->map = map;
    f->map_len = len;
    return 0;
}

void st_close(st_file *f) {
    if (f->map) munmap(f->map, f->map_len);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *st_meta_get(const st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

/* Writes buf to path atomically. */
static int write_file_atomic(const char *path, const void *buf, size_t len, errbuf *err) {
    const file_chunk chunk = {buf, len};
    return file_write_atomic(path, &chunk, 1, err);
}

/* ---------- writer ---------- */

/* Checks one tensor to write and returns its byte size. */
static int check_wtensor(const st_wtensor *t, bool need_data, uint64_t *nbytes, const char *path,
                         errbuf *err) {
    if (!t->name || !t->name[0]) return errf(err, "%s: tensor with an empty name", path);
    if (strlen(t->name) >= ST_MAX_NAME)
        return errf(err, "%s: tensor name '%.64s...' longer than %d bytes", path, t->name,
                    ST_MAX_NAME - 1);
    if (strcmp(t->name, "__metadata__") == 0)
        return errf(err, "%s: tensor name __metadata__ is reserved", path);
    if (!dtype_valid(t->dtype))
        return errf(err, "%s: tensor '%s': bad dtype %d", path, t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS)
        return errf(err, "%s: tensor '%s': ndim %d not in 0..%d", path, t->name, t->ndim,
                    ST_MAX_DIMS);
    uint64_t numel;
    if (shape_bytes(t->shape, t->ndim, t->dtype, &numel, nbytes) < 0)
        return errf(err, "%s: tensor '%s': negative dimension or size overflow", path, t->name);
    if (need_data && *nbytes > 0 && !t->data) return errf(err, "%s: tensor '%s': no data", path, t->name);
    return 0;
}

static json_t *meta_json(const st_meta *meta, int n_meta, const char *path, errbuf *err) {
    json_t *m = json_object();
    if (!m || json_object_set_new(m, "format", json_string("pt")) < 0) {
        json_decref(m);
        errf(err, "%s: out of memory", path);
        return NULL;
    }
    for (int i = 0; i < n_meta; i++) {
        const char *k = meta[i].key, *v = meta[i].value;
        /* "format" may be overridden; any other repeated key is a caller bug */
        if (!k || !v || (strcmp(k, "format") != 0 && json_object_get(m, k))) {
            errf(err, "%s: metadata entry %d is NULL or a duplicate ('%s')", path, i, k ? k : "");
            json_decref(m);
            return NULL;
        }
        json_t *s = json_string(v);
        if (!s || json_object_set_new(m, k, s) < 0) {
            errf(err, "%s: metadata '%s' is not valid UTF-8", path, k);
            json_decref(m);
            return NULL;
        }
    }
    return m;
}

static json_t *tensor_json(const st_wtensor *t, uint64_t begin, uint64_t end) {
    json_t *shape = json_array();
    if (!shape) return NULL;
    for (int d = 0; d < t->ndim; d++)
        if (json_array_append_new(shape, json_integer(t->shape[d])) < 0) {
            json_decref(shape);
            return NULL;
        }
    return json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtype_name(t->dtype), "shape", shape,
                     "data_offsets", (json_int_t)begin, (json_int_t)end);
}

/* Builds the JSON header text, padded with spaces to a multiple of 8 bytes, after the
 * 8-byte length; fills each tensor's byte size into nbytes. */
static char *build_header(const st_wtensor *t, int n, bool need_data, const st_meta *meta,
                          int n_meta, uint64_t *nbytes, size_t *len, const char *path, errbuf *err) {
    json_t *root = json_object(), *m = meta_json(meta, n_meta, path, err);
    char *text = NULL;
    if (!m) goto out;
    if (!root || json_object_set_new(root, "__metadata__", m) < 0) {
        if (!root) json_decref(m);
        errf(err, "%s: out of memory", path);
        goto out;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        if (check_wtensor(&t[i], need_data, &nbytes[i], path, err) < 0) goto out;
        if (json_object_get(root, t[i].name)) {
            errf(err, "%s: duplicate tensor name '%s'", path, t[i].name);
            goto out;
        }
        if (__builtin_add_overflow(offset, nbytes[i], &offset) || offset > INT64_MAX) {
            errf(err, "%s: total size overflows at tensor '%s'", path, t[i].name);
            goto out;
        }
        json_t *e = tensor_json(&t[i], offset - nbytes[i], offset);
        if (!e || json_object_set_new(root, t[i].name, e) < 0) {
            errf(err, "%s: tensor '%s': name is not valid UTF-8 (or out of memory)", path,
                 t[i].name);
            goto out;
        }
    }
    char *json = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!json) {
        errf(err, "%s: out of memory for the header", path);
        goto out;
    }
    size_t raw = strlen(json), padded = (raw + 7) & ~(size_t)7;
    text = malloc(8 + padded);
    if (!text) {
        errf(err, "%s: out of memory for the header", path);
    } else {
        for (int i = 0; i < 8; i++) text[i] = (char)((uint64_t)padded >> (8 * i));
        memcpy(text + 8, json, raw);
        memset(text + 8 + raw, ' ', padded - raw);
        *len = 8 + padded;
    }
    free(json);
out:
    json_decref(root);
    return text;
}

char *st_header(const st_wtensor *t, int n, const st_meta *meta, int n_meta, size_t *len,
                const char *path, errbuf *err) {
    uint64_t *nbytes = calloc(n > 0 ? (size_t)n : 1, sizeof *nbytes);
    char *header = nbytes ? build_header(t, n, false, meta, n_meta, nbytes, len, path, err)
                          : (errf(err, "%s: out of memory", path), NULL);
    free(nbytes);
    return header;
}

int st_write(const char *path, const st_wtensor *t, int n, const st_meta *meta, int n_meta,
             errbuf *err) {
    if (n < 0 || n_meta < 0) return errf(err, "%s: negative tensor or metadata count", path);
    uint64_t *nbytes = calloc(n ? (size_t)n : 1, sizeof *nbytes);
    if (!nbytes) return errf(err, "%s: out of memory", path);
    size_t header_len;
    char *header = build_header(t, n, true, meta, n_meta, nbytes, &header_len, path, err);
    file_chunk *chunks = header ? malloc(((size_t)n + 1) * sizeof *chunks) : NULL;
    int rc = -1;
    if (header && !chunks) errf(err, "%s: out of memory", path);
    if (chunks) {
        chunks[0] = (file_chunk){header, header_len};
        for (int i = 0; i < n; i++) chunks[i + 1] = (file_chunk){t[i].data, (size_t)nbytes[i]};
        rc = file_write_atomic(path, chunks, (size_t)n + 1, err);
    }
    free(chunks);
    free(header);
    free(nbytes);
    return rc;
}

/* ---------- model directories ---------- */

static int cmp_tensor_ptr(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_name_to_tensor(const void *key, const void *elem) {
    return strcmp(key, (*(const st_tensor *const *)elem)->name);
}

const st_tensor *st_model_find(const st_model *m, const char *name) {
    if (m->n_tensors == 0) return NULL;
    const st_tensor **p = bsearch(name, m->tensors, (size_t)m->n_tensors, sizeof *m->tensors,
                                  cmp_name_to_tensor);
    return p ? *p : NULL;
}

/* Index of the file holding t. */
static int file_of(const st_model *m, const st_tensor *t) {
    for (int i = 0; i < m->n_files; i++)
        if (t >= m->files[i].tensors && t < m->files[i].tensors + m->files[i].n_tensors) return i;
    return -1;
}

static int open_shard(st_model *m, const char *file, errbuf *err) {
    char *path;
    if (asprintf(&path, "%s/%s", m->dir, file) < 0) return errf(err, "%s: out of memory", m->dir);
    int rc = st_open(&m->files[m->n_files], path, err);
    free(path);
    if (rc == 0) m->n_files++;
    return rc;
}

/* Sorts every file's tensors into m->tensors and rejects names found in two files. */
static int collect_tensors(st_model *m, errbuf *err) {
    size_t total = 0;
    for (int i = 0; i < m->n_files; i++) total += (size_t)m->files[i].n_tensors;
    if (total > INT32_MAX) return errf(err, "%s: too many tensors", m->dir);
    m->tensors = calloc(total ? total : 1, sizeof *m->tensors);
    if (!m->tensors) return errf(err, "%s: out of memory for %zu tensors", m->dir, total);
    for (int i = 0; i < m->n_files; i++)
        for (int j = 0; j < m->files[i].n_tensors; j++)
            m->tensors[m->n_tensors++] = &m->files[i].tensors[j];
    qsort(m->tensors, total, sizeof *m->tensors, cmp_tensor_ptr);
    for (int i = 1; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i - 1]->name, m->tensors[i]->name) == 0)
            return errf(err, "%s: tensor '%s' is in both %s and %s", m->dir, m->tensors[i]->name,
                        m->files[file_of(m, m->tensors[i - 1])].path,
                        m->files[file_of(m, m->tensors[i])].path);
    return 0;
}

/* A shard name from the index must stay inside the model directory. */
static int plain_file_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Opens each distinct file named in weight_map once. */
static int open_indexed_files(st_model *m, const json_t *map, const char *index, errbuf *err) {
    size_t n = json_object_size(map);
    m->files = calloc(n ? n : 1, sizeof *m->files);
    const char **names = calloc(n ? n : 1, sizeof *names);
    int rc = -1;
    if (!m->files || !names) {
        errf(err, "%s: out of memory", index);
        goto out;
    }
    int n_names = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        const char *file = json_string_value(v);
        if (!file || !plain_file_name(file)) {
            errf(err, "%s: weight_map['%s'] is not a plain file name", index, key);
            goto out;
        }
        int seen = 0;
        for (int i = 0; i < n_names && !seen; i++) seen = strcmp(names[i], file) == 0;
        if (seen) continue;
        names[n_names++] = file;
        if (open_shard(m, file, err) < 0) goto out;
    }
    rc = 0;
out:
    free(names);
    return rc;
}

/* weight_map and the files' contents must agree both ways. */
static int check_weight_map(const st_model *m, const json_t *map, const char *index, errbuf *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        const st_tensor *t = st_model_find(m, key);
        if (!t)
            return errf(err, "%s: tensor '%s' is not in %s", index, key, json_string_value(v));
        const st_file *f = &m->files[file_of(m, t)];
        const char *base = f->path + strlen(m->dir) + 1;
        if (strcmp(base, json_string_value(v)) != 0)
            return errf(err, "%s: tensor '%s' is in %s, not %s", index, key, f->path,
                        json_string_value(v));
    }
    for (int i = 0; i < m->n_tensors; i++)
        if (!json_object_get(map, m->tensors[i]->name))
            return errf(err, "%s: tensor '%s' of %s is missing from weight_map", index,
                        m->tensors[i]->name, m->files[file_of(m, m->tensors[i])].path);
    return 0;
}

static int open_sharded(st_model *m, const char *index, errbuf *err) {
    /* Read through fileio, not json_load_file: a FIFO in its place is refused, not waited on. */
    char *text;
    size_t len;
    if (file_read_all(index, ST_MAX_INDEX, &text, &len, err) < 0) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) return errf(err, "%s: line %d: %s", index, jerr.line, jerr.text);
    const json_t *map = json_object_get(root, "weight_map");
    int rc;
    if (!json_is_object(map))
        rc = errf(err, "%s: missing weight_map object", index);
    else
        rc = open_indexed_files(m, map, index, err) < 0 || collect_tensors(m, err) < 0 ||
                     check_weight_map(m, map, index, err) < 0
                 ? -1
                 : 0;
    json_decref(root);
    return rc;
}

static int open_single(st_model *m, errbuf *err) {
    m->files = calloc(1, sizeof *m->files);
    if (!m->files) return errf(err, "%s: out of memory", m->dir);
    if (open_shard(m, ST_SINGLE_NAME, err) < 0) return -1;
    return collect_tensors(m, err);
}

int st_model_open(st_model *m, const char *dir, errbuf *err) {
    memset(m, 0, sizeof *m);
    m->dir = strdup(dir);
    char *index = NULL;
    if (!m->dir || asprintf(&index, "%s/" ST_INDEX_NAME, dir) < 0) {
        free(m->dir);
        m->dir = NULL;
        return errf(err, "%s: out of memory", dir);
    }
    struct stat st;
    int rc;
    if (stat(index, &st) == 0)
        rc = open_sharded(m, index, err);
    else if (errno == ENOENT)
        rc = open_single(m, err);
    else
        rc = errf(err, "%s: stat: %s", index, strerror(errno));
    free(index);
    if (rc < 0) st_model_close(m);
    return rc;
}

void st_model_close(st_model *m) {
    for (int i = 0; i < m->n_files; i++) st_close(&m->files[i]);
    free(m->files);
    free(m->tensors);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

/* Removes dir/name if present: a stale single file or index would shadow what we wrote. */
static int remove_stale(const char *dir, const char *name, errbuf *err) {
    char *path;
    if (asprintf(&path, "%s/%s", dir, name) < 0) return errf(err, "%s: out of memory", dir);
    int rc = 0;
    if (unlink(path) < 0 && errno != ENOENT) rc = errf(err, "%s: unlink: %s", path, strerror(errno));
    free(path);
    return rc;
}

json_t *st_index_json(const char *const *names, const char *const *files, int n, uint64_t total_size) {
    json_t *map = json_object();
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total_size,
                             "weight_map", map);
    for (int i = 0; root && i < n; i++)
        if (json_object_set_new(map, names[i], json_string(files[i])) < 0) root = (json_decref(root), NULL);
    return root;
}

static int write_index(const char *dir, const st_wtensor *t, const int *shard_of, int n,
                       int n_shards, uint64_t total, errbuf *err) {
    char *path;
    if (asprintf(&path, "%s/" ST_INDEX_NAME, dir) < 0) return errf(err, "%s: out of memory", dir);
    const char **names = calloc((size_t)n, sizeof *names), **files = calloc((size_t)n, sizeof *files);
    char (*shard_names)[64] = calloc((size_t)n_shards, sizeof *shard_names);
    json_t *root = NULL;
    char *text = NULL;
    int rc = -1;
    if (names && files && shard_names) {
        for (int k = 0; k < n_shards; k++)
            snprintf(shard_names[k], sizeof shard_names[k], "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        for (int i = 0; i < n; i++) names[i] = t[i].name, files[i] = shard_names[shard_of[i]];
        root = st_index_json(names, files, n, total);
    }
    if (root) text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (text) rc = write_file_atomic(path, text, strlen(text), err);
    else errf(err, "%s: out of memory", path);
    free(text);
    json_decref(root);
    free(names);
    free(files);
    free(shard_names);
    free(path);
    return rc;
}

/* Writes the shards (greedy, in order) and the index. */
static int write_shards(const char *dir, const st_wtensor *t, int n, const uint64_t *nbytes,
                        uint64_t shard_bytes, uint64_t total, errbuf *err) {
    int *shard_of = malloc((size_t)n * sizeof *shard_of);
    if (!shard_of) return errf(err, "%s: out of memory", dir);
    int n_shards = 0;
    uint64_t used = 0;
    for (int i = 0; i < n; i++) {
        if (n_shards == 0 || (used > 0 && used + nbytes[i] > shard_bytes)) {
            n_shards++;
            used = 0;
        }
        used += nbytes[i];
        shard_of[i] = n_shards - 1;
    }
    int rc = 0;
    for (int s = 0, first = 0; rc == 0 && s < n_shards; s++) {
        int last = first;
        while (last < n && shard_of[last] == s) last++;
        char *path;
        if (asprintf(&path, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, n_shards) < 0) {
            rc = errf(err, "%s: out of memory", dir);
            break;
        }
        rc = st_write(path, t + first, last - first, NULL, 0, err);
        free(path);
        first = last;
    }
    if (rc == 0) rc = write_index(dir, t, shard_of, n, n_shards, total, err);
    if (rc == 0) rc = remove_stale(dir, ST_SINGLE_NAME, err);
    free(shard_of);
    return rc;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* st_write checks names within one file; shards need the check across all of them. */
static int check_unique_names(const st_wtensor *t, int n, const char *dir, errbuf *err) {
    const char **names = malloc((n ? (size_t)n : 1) * sizeof *names);
    if (!names) return errf(err, "%s: out of memory", dir);
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    int rc = 0;
    for (int i = 1; i < n && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = errf(err, "%s: duplicate tensor name '%s'", dir, names[i]);
    free(names);
    return rc;
}

int st_write_model(const char *dir, const st_wtensor *t, int n, uint64_t shard_bytes,
                   errbuf *err) {
    if (n < 0) return errf(err, "%s: negative tensor count", dir);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return errf(err, "%s: mkdir: %s", dir, strerror(errno));
    uint64_t *nbytes = calloc(n ? (size_t)n : 1, sizeof *nbytes), total = 0;
    if (!nbytes) return errf(err, "%s: out of memory", dir);
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        rc = check_wtensor(&t[i], true, &nbytes[i], dir, err);
        if (rc == 0 && __builtin_add_overflow(total, nbytes[i], &total))
            rc = errf(err, "%s: total size overflows", dir);
    }
    if (rc == 0) rc = check_unique_names(t, n, dir, err);
    if (rc == 0 && total <= shard_bytes) {
        char *path;
        if (asprintf(&path, "%s/" ST_SINGLE_NAME, dir) < 0) {
            rc = errf(err, "%s: out of memory", dir);
        } else {
            rc = st_write(path, t, n, NULL, 0, err);
            free(path);
        }
        if (rc == 0) rc = remove_stale(dir, ST_INDEX_NAME, err);
    } else if (rc == 0) {
        rc = write_shards(dir, t, n, nbytes, shard_bytes, total, err);
    }
    free(nbytes);
    return rc;
}

/* ---------- reading values ---------- */

int st_read_f32(const st_tensor *t, size_t first, size_t n, float *dst, errbuf *err) {
    size_t es = st_dtype_size(t->dtype);
    const unsigned char *p = (const unsigned char *)t->data + first * es;
    switch (t->dtype) {
    case ST_F32:
        memcpy(dst, p, n * sizeof *dst); /* a mapped tensor need not be aligned */
        return 0;
    case ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, sizeof d);
            dst[i] = (float)d;
        }
        return 0;
    case ST_BF16:
    case ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, sizeof h);
            dst[i] = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        return 0;
    default:
        return errf(err, "tensor %s: dtype %s is not a floating-point type", t->name,
                    st_dtype_name(t->dtype));
    }
}

int st_check_finite(const float *v, size_t n, size_t first, const char *where, const char *name,
                    const char *why, errbuf *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return errf(err, "%s%stensor %s: element %zu is %s%s%s", where, where[0] ? ": " : "", name, first + i,
                        isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf", why[0] ? ": " : "", why);
    return 0;
}

/* The bytes of a tensor the fingerprint hashes (st_model_fingerprint). */
static void fingerprint_tensor(sha256_ctx *h, const st_tensor *t) {
    enum { WHOLE = 64 << 10, SAMPLES = 8, SAMPLE = 8 << 10 };
    uint8_t desc[16];
    sha256_update(h, t->name, strlen(t->name) + 1);
    le_put_u32(desc, (uint32_t)t->dtype);
    le_put_u32(desc + 4, (uint32_t)t->ndim);
    sha256_update(h, desc, 8);
    for (int d = 0; d < t->ndim; d++) {
        le_put_u64(desc, (uint64_t)t->shape[d]);
        sha256_update(h, desc, 8);
    }
    const uint8_t *data = t->data;
    if (t->nbytes <= WHOLE) {
        sha256_update(h, data, t->nbytes);
        return;
    }
    for (int i = 0; i < SAMPLES; i++)
        sha256_update(h, data + (t->nbytes - SAMPLE) / (SAMPLES - 1) * (uint64_t)i, SAMPLE);
}

void st_model_fingerprint(const st_model *m, char hex[ST_FINGERPRINT_HEX]) {
    sha256_ctx h;
    unsigned char digest[SHA256_BYTES];
    sha256_init(&h);
    for (int i = 0; i < m->n_tensors; i++) fingerprint_tensor(&h, m->tensors[i]);
    sha256_final(&h, digest);
    hex_encode(digest, SHA256_BYTES, hex);
}
