/* ckpt: the sharded checkpoint format.  See ckpt.h. */
#include "base/bytes.h"
#include "base/path.h"
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fileio.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint sections are little-endian fp32, copied as they are");

#define MAX_UNITS (1 << 16)        /* bounds what a header may claim */
#define MAX_ELEMENTS (1ull << 50)  /* per unit */
#define WRITE_CHUNK (64u << 20)
#define READ_CHUNK (8u << 20)


const char *ckpt_kind_name(int kind) {
    switch (kind) {
    case CKPT_MASTER: return "master";
    case CKPT_EXP_AVG: return "exp_avg";
    case CKPT_EXP_AVG_SQ: return "exp_avg_sq";
    default: return "unknown";
    }
}

/* ---- names ---- */

/* Whether snprintf's result n says that what it wrote fits a buffer of cap bytes. */
static bool fits(int n, size_t cap) { return n >= 0 && (size_t)n < cap; }

int ckpt_step_name(char *out, size_t n, int64_t step) {
    return fits(snprintf(out, n, "step-%06lld", (long long)step), n) ? 0 : -1;
}

int ckpt_partial_name(char *out, size_t n, int64_t step, int attempt) {
    return fits(snprintf(out, n, "step-%06lld.partial.%d", (long long)step, attempt), n) ? 0 : -1;
}

int ckpt_file_name(char *out, size_t n, int rank, int n_files) {
    return fits(snprintf(out, n, "rank-%05d-of-%05d.bin", rank, n_files), n) ? 0 : -1;
}

/* The shard files of a checkpoint: one a rank of the shard group, which writes them (no_shard:
 * rank 0; hybrid_shard: node 0's ranks, the other replicas hold the same state). */
int ckpt_n_files(const job_config *j, int world) {
    if (j->fsdp.sharding == JOB_SHARD_NONE) return 1;
    int per_node = j->runtime.workers_per_node;
    if (j->fsdp.sharding == JOB_SHARD_HYBRID && per_node > 0 && per_node < world) return per_node;
    return world;
}

/* Reads a run of 1..18 decimal digits at *p; advances *p past it. */
static int read_digits(const char **p, int64_t *value) {
    const char *s = *p;
    int64_t v = 0;
    int n = 0;
    while (*s >= '0' && *s <= '9' && n < 18) v = v * 10 + (*s++ - '0'), n++;
    if (n == 0 || (*s >= '0' && *s <= '9')) return -1;
    *p = s;
    *value = v;
    return 0;
}

int ckpt_parse_step_name(const char *name, int64_t *step) {
    const char *p = name;
    if (strncmp(p, "step-", 5) != 0) return 0;
    p += 5;
    return read_digits(&p, step) == 0 && *p == '\0';
}

int ckpt_parse_partial_name(const char *name, int64_t *step, int *attempt) {
    const char *p = name;
    int64_t a;
    if (strncmp(p, "step-", 5) != 0) return 0;
    p += 5;
    if (read_digits(&p, step) || strncmp(p, ".partial.", 9) != 0) return 0;
    p += 9;
    if (read_digits(&p, &a) || *p != '\0' || a > 2147483647) return 0;
    *attempt = (int)a;
    return 1;
}

/* ---- layout ---- */

int ckpt_layout_alloc(ckpt_layout *lo, int n_files, int n_units, int n_tensors, errbuf *err) {
    memset(lo, 0, sizeof *lo);
    if (n_files < 1 || n_units < 1 || n_units > MAX_UNITS || n_tensors < 1 || n_tensors > 64 * MAX_UNITS)
        return errf(err, "checkpoint layout: %d files, %d units, %d tensors is not a layout", n_files,
                    n_units, n_tensors);
    lo->units = calloc((size_t)n_units, sizeof *lo->units);
    lo->tensors = calloc((size_t)n_tensors, sizeof *lo->tensors);
    if (!lo->units || !lo->tensors) {
        ckpt_layout_free(lo);
        return errf(err, "checkpoint layout: out of memory");
    }
    lo->n_files = n_files;
    lo->n_units = n_units;
    lo->n_tensors = n_tensors;
    return 0;
}

void ckpt_layout_free(ckpt_layout *lo) {
    free(lo->units);
    free(lo->tensors);
    memset(lo, 0, sizeof *lo);
}

int ckpt_layout_from_slots(ckpt_layout *lo, int n_files, const llama_unit *units, int n_units,
                           const llama_tensor_slot *tensors, int n_tensors, errbuf *err) {
    if (ckpt_layout_alloc(lo, n_files, n_units, n_tensors, err)) return -1;
    for (int u = 0; u < n_units; u++) {
        uint64_t numel = units[u].numel, padded = (numel + (uint64_t)n_files - 1) / (uint64_t)n_files * (uint64_t)n_files;
        lo->units[u] = (ckpt_unit){.numel = numel, .padded = padded, .shard = padded / (uint64_t)n_files,
                                   .first = units[u].first, .count = units[u].count};
    }
    for (int i = 0; i < n_tensors; i++) {
        const llama_tensor_slot *s = &tensors[i];
        ckpt_tensor *t = &lo->tensors[i];
        *t = (ckpt_tensor){.offset = s->offset, .numel = s->numel, .ndim = s->ndim,
                           .shape = {s->shape[0], s->ndim == 2 ? s->shape[1] : 0}, .is_norm = s->is_norm};
        snprintf(t->name, sizeof t->name, "%s", s->name);
    }
    int rc = ckpt_layout_check(lo, err);
    if (rc) ckpt_layout_free(lo);
    return rc;
}

int ckpt_layout_check(const ckpt_layout *lo, errbuf *err) {
    if (lo->n_files < 1 || lo->n_units < 1 || lo->n_tensors < 1)
        return errf(err, "layout: no files, units or tensors");
    int next = 0;
    for (int u = 0; u < lo->n_units; u++) {
        const ckpt_unit *U = &lo->units[u];
        if (U->numel < 1 || U->numel > MAX_ELEMENTS)
            return errf(err, "unit %d: numel %llu out of range", u, (unsigned long long)U->numel);
        if (U->padded != round_up(U->numel, (uint64_t)lo->n_files) ||
            U->shard != U->padded / (uint64_t)lo->n_files)
            return errf(err, "unit %d: padded %llu and shard %llu do not follow from numel %llu and "
                             "%d files", u, (unsigned long long)U->padded,
                        (unsigned long long)U->shard, (unsigned long long)U->numel, lo->n_files);
        if (U->first != next || U->count < 1 || U->count > lo->n_tensors - next)
            return errf(err, "unit %d: tensors %d..%d are not the next ones", u, U->first,
                        U->first + U->count - 1);
        uint64_t at = 0;
        for (int i = U->first; i < U->first + U->count; i++) {
            const ckpt_tensor *t = &lo->tensors[i];
            if (t->ndim < 1 || t->ndim > 2 || t->shape[0] < 1 || (t->ndim == 2 && t->shape[1] < 1))
                return errf(err, "tensor %s: bad shape", t->name);
            uint64_t numel = (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
            if (t->numel != numel || t->offset != at || numel > U->numel - at)
                return errf(err, "tensor %s: offset %llu, %llu elements do not fit unit %d after "
                                 "%llu elements", t->name, (unsigned long long)t->offset,
                            (unsigned long long)t->numel, u, (unsigned long long)at);
            at += numel;
        }
        if (at != U->numel)
            return errf(err, "unit %d: tensors hold %llu of its %llu elements", u,
                        (unsigned long long)at, (unsigned long long)U->numel);
        next += U->count;
    }
    if (next != lo->n_tensors) return errf(err, "layout: %d tensors belong to no unit", lo->n_tensors - next);
    return 0;
}

json_t *ckpt_layout_to_json(const ckpt_layout *lo) {
    json_t *units = json_array();
    for (int u = 0; units && u < lo->n_units; u++) {
        const ckpt_unit *U = &lo->units[u];
        json_t *tensors = json_array();
        for (int i = U->first; tensors && i < U->first + U->count; i++) {
            const ckpt_tensor *t = &lo->tensors[i];
            json_t *shape = t->ndim == 2 ? json_pack("[I, I]", (json_int_t)t->shape[0], (json_int_t)t->shape[1])
                                         : json_pack("[I]", (json_int_t)t->shape[0]);
            if (json_array_append_new(tensors, json_pack("{s:s, s:I, s:o, s:b}", "name", t->name, "offset",
                                                         (json_int_t)t->offset, "shape", shape,
                                                         "is_norm", t->is_norm)))
                tensors = (json_decref(tensors), NULL);
        }
        json_t *unit = tensors ? json_pack("{s:I, s:I, s:I, s:o}", "numel", (json_int_t)U->numel, "padded",
                                           (json_int_t)U->padded, "shard", (json_int_t)U->shard,
                                           "tensors", tensors)
                               : NULL;
        if (json_array_append_new(units, unit)) units = (json_decref(units), NULL);
    }
    return units;
}

/* ---- JSON readers: errors name the key ---- */

static int get_int(const json_t *obj, const char *key, int64_t min, int64_t *out, const char *name,
                   errbuf *err) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) return errf(err, "%s: \"%s\": missing or not an integer", name, key);
    if (json_integer_value(v) < min)
        return errf(err, "%s: \"%s\": %lld is below %lld", name, key, (long long)json_integer_value(v),
                    (long long)min);
    *out = json_integer_value(v);
    return 0;
}

static int get_int32(const json_t *obj, const char *key, int64_t min, int *out, const char *name,
                     errbuf *err) {
    int64_t v;
    if (get_int(obj, key, min, &v, name, err)) return -1;
    if (v > 2147483647) return errf(err, "%s: \"%s\": %lld is too large", name, key, (long long)v);
    *out = (int)v;
    return 0;
}

static int get_u64(const json_t *obj, const char *key, uint64_t *out, const char *name, errbuf *err) {
    int64_t v;
    if (get_int(obj, key, 0, &v, name, err)) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int get_real(const json_t *obj, const char *key, double *out, const char *name, errbuf *err) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_number(v)) return errf(err, "%s: \"%s\": missing or not a number", name, key);
    *out = json_number_value(v);
    return 0;
}

static int get_str(const json_t *obj, const char *key, char *out, size_t n, const char *name,
                   errbuf *err) {
    const char *s = json_string_value(json_object_get(obj, key));
    if (!s) return errf(err, "%s: \"%s\": missing or not a string", name, key);
    if (strlen(s) >= n) return errf(err, "%s: \"%s\": longer than %zu bytes", name, key, n - 1);
    strcpy(out, s);
    return 0;
}

static int read_tensor(ckpt_tensor *t, const json_t *jt, const char *name, errbuf *err) {
    const json_t *shape = json_object_get(jt, "shape");
    const json_t *is_norm = json_object_get(jt, "is_norm");
    if (!json_is_object(jt)) return errf(err, "%s: a tensor is not an object", name);
    if (get_str(jt, "name", t->name, sizeof t->name, name, err) ||
        get_u64(jt, "offset", &t->offset, name, err))
        return -1;
    if (!json_is_array(shape) || json_array_size(shape) < 1 || json_array_size(shape) > 2)
        return errf(err, "%s: tensor %s: \"shape\" is not a list of 1 or 2 sizes", name, t->name);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        const json_t *s = json_array_get(shape, (size_t)d);
        if (!json_is_integer(s) || json_integer_value(s) < 1 || json_integer_value(s) > (1ll << 40))
            return errf(err, "%s: tensor %s: bad shape", name, t->name);
        t->shape[d] = json_integer_value(s);
    }
    t->numel = (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
    if (!json_is_boolean(is_norm)) return errf(err, "%s: tensor %s: \"is_norm\" is not a boolean", name, t->name);
    t->is_norm = json_is_true(is_norm);
    return 0;
}

int ckpt_layout_from_json(ckpt_layout *lo, const json_t *units, int n_files, const char *name,
                          errbuf *err) {
    memset(lo, 0, sizeof *lo);
    if (!json_is_array(units) || json_array_size(units) < 1)
        return errf(err, "%s: \"units\": missing or not a list", name);
    size_t n_tensors = 0, n_units = json_array_size(units);
    for (size_t u = 0; u < n_units; u++) {
        const json_t *t = json_object_get(json_array_get(units, u), "tensors");
        if (!json_is_array(t) || json_array_size(t) < 1)
            return errf(err, "%s: unit %zu: \"tensors\": missing or empty", name, u);
        n_tensors += json_array_size(t);
    }
    if (n_units > MAX_UNITS || n_tensors > 64 * (size_t)MAX_UNITS)
        return errf(err, "%s: %zu units, %zu tensors: too many", name, n_units, n_tensors);
    if (ckpt_layout_alloc(lo, n_files, (int)n_units, (int)n_tensors, err)) return errprefix(err, "%s", name);
    int next = 0;
    for (size_t u = 0; u < n_units; u++) {
        const json_t *ju = json_array_get(units, u), *jt = json_object_get(ju, "tensors");
        ckpt_unit *U = &lo->units[u];
        if (get_u64(ju, "numel", &U->numel, name, err) || get_u64(ju, "padded", &U->padded, name, err) ||
            get_u64(ju, "shard", &U->shard, name, err))
            goto fail;
        U->first = next;
        U->count = (int)json_array_size(jt);
        for (int i = 0; i < U->count; i++)
            if (read_tensor(&lo->tensors[next++], json_array_get(jt, (size_t)i), name, err)) goto fail;
    }
    if (ckpt_layout_check(lo, err) == 0) return 0;
    errprefix(err, "%s", name);
fail:
    ckpt_layout_free(lo);
    return -1;
}

/* ---- shard files ---- */

uint64_t ckpt_header_block_bytes(int n_units) {
    return round_up(CKPT_FIXED_HEADER + (uint64_t)CKPT_SECTION_ENTRY * CKPT_KINDS * (uint64_t)n_units,
                    CKPT_ALIGN);
}

static uint32_t header_bytes(int n_sections) {
    return CKPT_FIXED_HEADER + CKPT_SECTION_ENTRY * (uint32_t)n_sections;
}

/* CRC32C of the header's bytes with the CRC field (60..63) read as zero. */
static uint32_t header_crc(const uint8_t *p, uint32_t len) {
    static const uint8_t zero[4];
    uint32_t c = crc32c(0, p, 60);
    c = crc32c(c, zero, 4);
    return crc32c(c, p + CKPT_FIXED_HEADER, len - CKPT_FIXED_HEADER);
}

int ckpt_plan(ckpt_file_header *h, const ckpt_layout *lo, int rank, int64_t step, errbuf *err) {
    memset(h, 0, sizeof *h);
    if (rank < 0 || rank >= lo->n_files) return errf(err, "checkpoint: rank %d of %d files", rank, lo->n_files);
    h->rank = (uint32_t)rank;
    h->n_files = (uint32_t)lo->n_files;
    h->n_units = (uint32_t)lo->n_units;
    h->step = (uint64_t)step;
    h->n_sections = CKPT_KINDS * lo->n_units;
    h->header_block = ckpt_header_block_bytes(lo->n_units);
    h->sections = calloc((size_t)h->n_sections, sizeof *h->sections);
    if (!h->sections) return errf(err, "checkpoint: out of memory");
    uint64_t at = h->header_block;
    for (int kind = 1; kind <= CKPT_KINDS; kind++)
        for (int u = 0; u < lo->n_units; u++) {
            ckpt_section *s = &h->sections[ckpt_section_index(lo->n_units, kind, u)];
            at = round_up(at, CKPT_ALIGN);
            *s = (ckpt_section){.kind = (uint32_t)kind, .unit = (uint32_t)u, .offset = at,
                                .bytes = lo->units[u].shard * sizeof(float)};
            at += s->bytes;
        }
    h->file_bytes = at;
    return 0;
}

void ckpt_file_header_free(ckpt_file_header *h) {
    free(h->sections);
    memset(h, 0, sizeof *h);
}

void ckpt_encode_header(ckpt_file_header *h, void *block) {
    uint8_t *p = block;
    memset(p, 0, h->header_block);
    memcpy(p, CKPT_MAGIC, 8);
    uint32_t len = header_bytes(h->n_sections);
    le_put_u32(p + 8, CKPT_VERSION);
    le_put_u32(p + 12, len);
    le_put_u32(p + 16, h->rank);
    le_put_u32(p + 20, h->n_files);
    le_put_u32(p + 24, h->n_units);
    le_put_u32(p + 28, (uint32_t)h->n_sections);
    le_put_u64(p + 32, h->step);
    le_put_u64(p + 40, h->file_bytes);
    le_put_u32(p + 48, CKPT_DTYPE_F32);
    for (int i = 0; i < h->n_sections; i++) {
        uint8_t *e = p + CKPT_FIXED_HEADER + (size_t)CKPT_SECTION_ENTRY * (size_t)i;
        const ckpt_section *s = &h->sections[i];
        le_put_u32(e, s->kind);
        le_put_u32(e + 4, s->unit);
        le_put_u64(e + 8, s->offset);
        le_put_u64(e + 16, s->bytes);
        le_put_u32(e + 24, s->crc);
    }
    h->crc = header_crc(p, len);
    le_put_u32(p + 60, h->crc);
}

int ckpt_decode_header(ckpt_file_header *h, const void *buf, size_t len, const char *name,
                       errbuf *err) {
    const uint8_t *p = buf;
    memset(h, 0, sizeof *h);
    if (len < CKPT_FIXED_HEADER) return errf(err, "%s: %zu bytes: too short for a checkpoint header", name, len);
    if (memcmp(p, CKPT_MAGIC, 8) != 0) return errf(err, "%s: not a checkpoint shard file (bad magic)", name);
    uint32_t version = le_get_u32(p + 8), hb = le_get_u32(p + 12), n_units = le_get_u32(p + 24);
    uint32_t n_sections = le_get_u32(p + 28);
    if (version != CKPT_VERSION)
        return errf(err, "%s: format version %u (this build reads version %d)", name, version, CKPT_VERSION);
    if (n_units < 1 || n_units > MAX_UNITS || n_sections != CKPT_KINDS * n_units ||
        hb != header_bytes((int)n_sections))
        return errf(err, "%s: header claims %u units, %u sections, %u header bytes: inconsistent", name,
                    n_units, n_sections, hb);
    if (len < hb) return errf(err, "%s: header of %u bytes is truncated at %zu", name, hb, len);
    uint32_t crc = le_get_u32(p + 60);
    if (header_crc(p, hb) != crc)
        return errf(err, "%s: header CRC32C mismatch (stored %08x, computed %08x): the file is corrupt",
                    name, crc, header_crc(p, hb));
    h->rank = le_get_u32(p + 16);
    h->n_files = le_get_u32(p + 20);
    h->n_units = n_units;
    h->step = le_get_u64(p + 32);
    h->file_bytes = le_get_u64(p + 40);
    h->header_block = ckpt_header_block_bytes((int)n_units);
    h->crc = crc;
    h->n_sections = (int)n_sections;
    if (h->n_files < 1 || h->rank >= h->n_files)
        return errf(err, "%s: rank %u of %u files", name, h->rank, h->n_files);
    if (le_get_u32(p + 48) != CKPT_DTYPE_F32) return errf(err, "%s: unknown dtype %u", name, le_get_u32(p + 48));
    h->sections = calloc(n_sections, sizeof *h->sections);
    if (!h->sections) return errf(err, "%s: out of memory", name);
    uint64_t end = h->header_block;
    for (uint32_t i = 0; i < n_sections; i++) {
        const uint8_t *e = p + CKPT_FIXED_HEADER + (size_t)CKPT_SECTION_ENTRY * i;
        ckpt_section *s = &h->sections[i];
        *s = (ckpt_section){.kind = le_get_u32(e), .unit = le_get_u32(e + 4), .offset = le_get_u64(e + 8),
                            .bytes = le_get_u64(e + 16), .crc = le_get_u32(e + 24)};
        if (ckpt_section_index((int)n_units, (int)s->kind, (int)s->unit) != (int)i || s->kind < 1 ||
            s->kind > CKPT_KINDS || s->unit >= n_units || s->offset < end || s->offset % CKPT_ALIGN ||
            s->bytes % sizeof(float) || s->bytes > h->file_bytes || s->offset > h->file_bytes - s->bytes) {
            ckpt_file_header_free(h);
            return errf(err, "%s: section %u is out of place", name, i);
        }
        end = s->offset + s->bytes;
    }
    return 0;
}

int ckpt_read_header(ckpt_file_header *h, int fd, const char *path, errbuf *err) {
    memset(h, 0, sizeof *h);
    struct stat st;
    uint8_t fixed[CKPT_FIXED_HEADER];
    if (fstat(fd, &st) != 0) return errf(err, "%s: %s", path, strerror(errno));
    if ((uint64_t)st.st_size < sizeof fixed)
        return errf(err, "%s: %lld bytes: truncated (no header)", path, (long long)st.st_size);
    if (file_pread_full(fd, fixed, sizeof fixed, 0, path, err)) return -1;
    uint32_t hb = le_get_u32(fixed + 12);
    if (hb < CKPT_FIXED_HEADER || hb > header_bytes(CKPT_KINDS * MAX_UNITS))
        hb = CKPT_FIXED_HEADER; /* let the decoder name the problem */
    if ((uint64_t)st.st_size < hb) return errf(err, "%s: truncated inside its header", path);
    uint8_t *buf = malloc(hb);
    if (!buf) return errf(err, "%s: out of memory", path);
    int rc = file_pread_full(fd, buf, hb, 0, path, err);
    if (rc == 0) rc = ckpt_decode_header(h, buf, hb, path, err);
    free(buf);
    if (rc == 0 && (uint64_t)st.st_size != h->file_bytes) {
        rc = errf(err, "%s: %lld bytes, but its header says %llu: %s", path, (long long)st.st_size,
                  (unsigned long long)h->file_bytes,
                  (uint64_t)st.st_size < h->file_bytes ? "truncated" : "trailing bytes");
        ckpt_file_header_free(h);
    }
    return rc;
}

/* Write-behind: starts the disk writing bytes [started, written) and waits for bytes
 * [waited, started), started the time before, so the disk works while the next chunk is
 * CRC'd and copied and the final fsync has little left to do (about two chunks of the file
 * are dirty at a time).  Only a hint: an error here shows again in fsync, which counts. */
static void write_behind(int fd, uint64_t waited, uint64_t started, uint64_t written) {
    if (sync_file_range(fd, (off_t)started, (off_t)(written - started), SYNC_FILE_RANGE_WRITE) != 0)
        return;
    if (started > waited)
        sync_file_range(fd, (off_t)waited, (off_t)(started - waited),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
}

/* Writes image to path in file order; with crc, each section's CRC is computed just before
 * its bytes are written (while they are in cache) and the header, which holds the CRCs, is
 * encoded and written last; without, the image is sealed already (ckpt_seal_image). */
static int write_image(const char *path, uint8_t *img, ckpt_file_header *h, int crc, ckpt_progress_fn progress,
                       void *arg, errbuf *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return errf(err, "%s: %s", path, strerror(errno));
    uint64_t written = h->header_block, started = written, waited = written;
    int rc = 0;
    for (int i = 0; i < h->n_sections && rc == 0; i++) {
        ckpt_section *s = &h->sections[i];
        if (s->offset > written)
            rc = file_pwrite_full(fd, img + written, s->offset - written, (off_t)written, path, err);
        written = s->offset;
        if (crc) s->crc = 0;
        for (uint64_t at = 0; at < s->bytes && rc == 0; at += WRITE_CHUNK) {
            size_t n = s->bytes - at < WRITE_CHUNK ? (size_t)(s->bytes - at) : WRITE_CHUNK;
            if (progress && progress(arg, written, h->file_bytes)) {
                rc = errf(err, "%s: abandoned after %llu of %llu bytes", path,
                          (unsigned long long)written, (unsigned long long)h->file_bytes);
                break;
            }
            if (crc) s->crc = crc32c(s->crc, img + s->offset + at, n);
            rc = file_pwrite_full(fd, img + s->offset + at, n, (off_t)(s->offset + at), path, err);
            written += n;
            if (rc == 0 && written - started >= WRITE_CHUNK) {
                write_behind(fd, waited, started, written);
                waited = started;
                started = written;
            }
        }
    }
    if (rc == 0 && progress && progress(arg, written, h->file_bytes))
        rc = errf(err, "%s: abandoned after %llu of %llu bytes", path, (unsigned long long)written,
                  (unsigned long long)h->file_bytes);
    if (rc == 0) {
        if (crc) ckpt_encode_header(h, img);
        rc = file_pwrite_full(fd, img, h->header_block, 0, path, err);
    }
    if (rc == 0 && fsync(fd) != 0) rc = errf(err, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == 0) rc = errf(err, "%s: close: %s", path, strerror(errno));
    if (rc != 0) unlink(path);
    return rc;
}

int ckpt_write_image(const char *path, void *image, ckpt_file_header *h,
                     ckpt_progress_fn progress, void *arg, errbuf *err) {
    return write_image(path, image, h, 1, progress, arg, err);
}

int ckpt_write_sealed(const char *path, const void *image, const ckpt_file_header *h,
                      ckpt_progress_fn progress, void *arg, errbuf *err) {
    return write_image(path, (uint8_t *)image, (ckpt_file_header *)h, 0, progress, arg, err);
}

void ckpt_unseal_image(void *image) {
    memset(image, 0, sizeof CKPT_MAGIC - 1);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void ckpt_seal_image(void *image, ckpt_file_header *h) {
    uint8_t *img = image;
    for (int i = 0; i < h->n_sections; i++) {
        ckpt_section *s = &h->sections[i];
        s->crc = crc32c(0, img + s->offset, (size_t)s->bytes);
    }
    /* The sections' bytes before the header that vouches for them (ckpt_unseal_image). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    ckpt_encode_header(h, img);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* ---- manifest ---- */

static json_t *train_json(const ckpt_train_settings *t) {
    return json_pack("{s:f, s:f, s:s, s:i, s:f, s:s, s:I, s:f, s:[f, f], s:f, s:f, s:s, s:f, s:s, s:f, s:f}",
                     "lr", t->lr, "min_lr", t->min_lr, "schedule", t->schedule, "warmup_steps", t->warmup_steps,
                     "warmup_ratio", t->warmup_ratio, "warmup_round", t->warmup_round[0] ? t->warmup_round : "up",
                     "total_steps", (json_int_t)t->total_steps, "weight_decay", t->weight_decay,
                     "betas", t->betas[0], t->betas[1], "eps", t->eps, "clip_norm", t->clip_norm,
                     "objective", t->objective[0] ? t->objective : "sft", "dpo_beta", t->dpo_beta,
                     "dpo_loss", t->dpo_loss[0] ? t->dpo_loss : "sigmoid",
                     "dpo_label_smoothing", t->dpo_label_smoothing, "orpo_lambda", t->orpo_lambda);
}

/* The objective's keys of "train", each optional (manifests before F49): "sft" and the job
 * defaults when absent; a key present must be of its type. */
static int read_objective(ckpt_train_settings *t, const json_t *jt, const char *name, errbuf *err) {
    snprintf(t->objective, sizeof t->objective, "sft");
    snprintf(t->dpo_loss, sizeof t->dpo_loss, "sigmoid");
    t->dpo_beta = 0.1;
    t->dpo_label_smoothing = 0;
    t->orpo_lambda = 0.1;
    return (json_object_get(jt, "objective") && get_str(jt, "objective", t->objective, sizeof t->objective, name, err)) ||
           (json_object_get(jt, "dpo_beta") && get_real(jt, "dpo_beta", &t->dpo_beta, name, err)) ||
           (json_object_get(jt, "dpo_loss") && get_str(jt, "dpo_loss", t->dpo_loss, sizeof t->dpo_loss, name, err)) ||
           (json_object_get(jt, "dpo_label_smoothing") &&
            get_real(jt, "dpo_label_smoothing", &t->dpo_label_smoothing, name, err)) ||
           (json_object_get(jt, "orpo_lambda") && get_real(jt, "orpo_lambda", &t->orpo_lambda, name, err))
               ? -1 : 0;
}

static json_t *adapter_json(const ckpt_manifest *m) {
    if (!m->has_adapter) return json_null();
    const ckpt_adapter *a = &m->adapter;
    json_t *targets = json_array();
    for (int t = 0; targets && t < LORA_MODULES; t++)
        if ((a->lora.targets & (1u << t)) &&
            json_array_append_new(targets, json_string(lora_module_name(t))))
            targets = (json_decref(targets), NULL);
    return json_pack("{s:s, s:i, s:f, s:b, s:f, s:o, s:s}", "type", a->type, "rank", a->lora.rank,
                     "alpha", a->lora.alpha, "rslora", a->lora.rslora, "dropout", a->lora.dropout,
                     "targets", targets, "base_fingerprint", a->base_fingerprint);
}

/* The "adapter" block: absent or null for a full fine-tune; else every key, checked. */
static int read_adapter(ckpt_manifest *m, const json_t *ja, const char *name, errbuf *err) {
    if (!ja || json_is_null(ja)) return 0;
    ckpt_adapter *a = &m->adapter;
    const json_t *targets = json_object_get(ja, "targets"), *rslora = json_object_get(ja, "rslora");
    if (!json_is_object(ja)) return errf(err, "%s: \"adapter\": not an object or null", name);
    if (get_str(ja, "type", a->type, sizeof a->type, name, err) ||
        get_int32(ja, "rank", 1, &a->lora.rank, name, err) ||
        get_real(ja, "alpha", &a->lora.alpha, name, err) ||
        get_real(ja, "dropout", &a->lora.dropout, name, err) ||
        get_str(ja, "base_fingerprint", a->base_fingerprint, sizeof a->base_fingerprint, name, err))
        return -1;
    if (strcmp(a->type, "lora") && strcmp(a->type, "qlora"))
        return errf(err, "%s: \"adapter.type\": \"%s\", expected lora or qlora", name, a->type);
    if (!json_is_boolean(rslora)) return errf(err, "%s: \"adapter.rslora\": missing or not a boolean", name);
    a->lora.rslora = json_is_true(rslora);
    if (strlen(a->base_fingerprint) != 64 || strspn(a->base_fingerprint, "0123456789abcdef") != 64)
        return errf(err, "%s: \"adapter.base_fingerprint\": not 64 hex digits", name);
    if (!json_is_array(targets) || json_array_size(targets) == 0)
        return errf(err, "%s: \"adapter.targets\": not a list of module names", name);
    for (size_t i = 0; i < json_array_size(targets); i++) {
        const char *t = json_string_value(json_array_get(targets, i));
        int mod = t ? lora_module_from_name(t) : -1;
        if (mod < 0 || (a->lora.targets & (1u << mod)))
            return errf(err, "%s: \"adapter.targets\"[%zu]: not a module name, or listed twice", name, i);
        a->lora.targets |= 1u << mod;
    }
    m->has_adapter = 1;
    return 0;
}

static json_t *identity_json(const ckpt_manifest *m) {
    if (!m->has_identity) return NULL; /* no key: only a test writes an old manifest */
    const ckpt_identity *id = &m->identity;
    json_t *data = json_pack("{s:s, s:s, s:s, s:s, s:i, s:b, s:b, s:f}", "source", id->data.source, "sha256",
                             id->data.sha256, "format", id->data_format, "template", id->data_template,
                             "seq_len", id->seq_len, "packing", id->packing, "shuffle", id->shuffle,
                             "eval_fraction", id->eval_fraction);
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:i, s:i}", "train_type", id->train_type, "model_fingerprint",
                     id->model_fingerprint, "tokenizer_sha256", id->data.tokenizer_sha256, "optimizer",
                     id->optimizer, "data", data, "max_steps", id->max_steps, "epochs", id->epochs);
}

static int is_hex64(const char *s) { return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64; }

static int get_bool(const json_t *obj, const char *key, int *out, const char *name, errbuf *err) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_boolean(v)) return errf(err, "%s: \"%s\": missing or not a boolean", name, key);
    *out = json_is_true(v);
    return 0;
}

static int one_of(const char *s, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(s, *names)) return 1;
    return 0;
}

/* The "data" block of "identity", every key checked. */
static int read_data_identity(ckpt_identity *id, const json_t *jd, const char *name, errbuf *err) {
    static const char *const sources[] = {"tokens", "jsonl", NULL};
    static const char *const formats[] = {"tokens", "alpaca", "chat", "text", NULL};
    if (!json_is_object(jd)) return errf(err, "%s: \"identity.data\": missing or not an object", name);
    if (get_str(jd, "source", id->data.source, sizeof id->data.source, name, err) ||
        get_str(jd, "sha256", id->data.sha256, sizeof id->data.sha256, name, err) ||
        get_str(jd, "format", id->data_format, sizeof id->data_format, name, err) ||
        get_str(jd, "template", id->data_template, sizeof id->data_template, name, err) ||
        get_int32(jd, "seq_len", 1, &id->seq_len, name, err) || get_bool(jd, "packing", &id->packing, name, err) ||
        get_bool(jd, "shuffle", &id->shuffle, name, err) ||
        get_real(jd, "eval_fraction", &id->eval_fraction, name, err))
        return -1;
    if (!one_of(id->data.source, sources))
        return errf(err, "%s: \"identity.data.source\": \"%s\", expected tokens or jsonl", name, id->data.source);
    if (!one_of(id->data_format, formats))
        return errf(err, "%s: \"identity.data.format\": \"%s\" is not a data format", name, id->data_format);
    if (!is_hex64(id->data.sha256))
        return errf(err, "%s: \"identity.data.sha256\": not 64 hex digits", name);
    return 0;
}

/* The "identity" block: absent in manifests written before it (has_identity 0); else every
 * key, checked. */
static int read_identity(ckpt_manifest *m, const json_t *ji, const char *name, errbuf *err) {
    static const char *const types[] = {"full", "lora", "qlora", NULL};
    if (!ji) return 0;
    ckpt_identity *id = &m->identity;
    if (!json_is_object(ji)) return errf(err, "%s: \"identity\": not an object", name);
    if (get_str(ji, "train_type", id->train_type, sizeof id->train_type, name, err) ||
        get_str(ji, "model_fingerprint", id->model_fingerprint, sizeof id->model_fingerprint, name, err) ||
        get_str(ji, "tokenizer_sha256", id->data.tokenizer_sha256, sizeof id->data.tokenizer_sha256, name, err) ||
        get_str(ji, "optimizer", id->optimizer, sizeof id->optimizer, name, err) ||
        get_int32(ji, "max_steps", 0, &id->max_steps, name, err) || get_int32(ji, "epochs", 0, &id->epochs, name, err) ||
        read_data_identity(id, json_object_get(ji, "data"), name, err))
        return -1;
    if (!one_of(id->train_type, types))
        return errf(err, "%s: \"identity.train_type\": \"%s\", expected full, lora or qlora", name, id->train_type);
    if (!is_hex64(id->model_fingerprint))
        return errf(err, "%s: \"identity.model_fingerprint\": not 64 hex digits", name);
    if (id->data.tokenizer_sha256[0] && !is_hex64(id->data.tokenizer_sha256))
        return errf(err, "%s: \"identity.tokenizer_sha256\": not 64 hex digits or \"\"", name);
    if (strcmp(id->optimizer, "adamw"))
        return errf(err, "%s: \"identity.optimizer\": \"%s\" (this build trains adamw only)", name, id->optimizer);
    if ((strcmp(id->train_type, "full") != 0) != (m->has_adapter != 0))
        return errf(err, "%s: \"identity.train_type\" is %s but the manifest %s an adapter block", name,
                    id->train_type, m->has_adapter ? "has" : "has no");
    m->has_identity = 1;
    return 0;
}

int ckpt_manifest_to_json(const ckpt_manifest *m, char **text, errbuf *err) {
    *text = NULL;
    json_t *files = json_array();
    for (int r = 0; files && r < m->layout.n_files; r++) {
        const ckpt_file_entry *f = &m->files[r];
        if (json_array_append_new(files, json_pack("{s:s, s:i, s:I, s:I}", "name", f->name, "rank",
                                                   f->rank, "bytes", (json_int_t)f->bytes,
                                                   "header_crc32c", (json_int_t)f->header_crc)))
            files = (json_decref(files), NULL);
    }
    json_t *root = json_pack(
        "{s:s, s:i, s:I, s:I, s:I, s:I, s:i, s:I, s:i, s:s, s:i, s:s, s:o, s:O, s:s, s:o, s:o, s:o}",
        "format", CKPT_FORMAT, "version", CKPT_VERSION, "step", (json_int_t)m->step,
        "optimizer_step", (json_int_t)m->optimizer_step, "global_sample",
        (json_int_t)m->global_sample, "tokens_seen", (json_int_t)m->tokens_seen, "global_batch",
        m->global_batch, "seed", (json_int_t)m->seed, "world_size", m->world_size, "sharding",
        m->sharding, "n_files", m->layout.n_files, "dtype", "f32", "train", train_json(&m->train),
        "model_config", m->model_config ? m->model_config : json_null(), "model_path",
        m->model_path, "adapter", adapter_json(m), "units", ckpt_layout_to_json(&m->layout),
        "files", files);
    if (!root) return errf(err, "manifest: out of memory building the JSON");
    json_t *identity = identity_json(m);
    if (m->has_identity && (!identity || json_object_set_new(root, "identity", identity))) {
        json_decref(root);
        return errf(err, "manifest: out of memory building the JSON");
    }
    *text = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
    json_decref(root);
    return *text ? 0 : errf(err, "manifest: out of memory formatting the JSON");
}

static int read_train(ckpt_train_settings *t, const json_t *jt, const char *name, errbuf *err) {
    const json_t *betas = json_object_get(jt, "betas");
    if (!json_is_object(jt)) return errf(err, "%s: \"train\": missing or not an object", name);
    t->warmup_ratio = 0;
    snprintf(t->warmup_round, sizeof t->warmup_round, "up");
    if (get_real(jt, "lr", &t->lr, name, err) || get_real(jt, "min_lr", &t->min_lr, name, err) ||
        get_str(jt, "schedule", t->schedule, sizeof t->schedule, name, err) ||
        get_int32(jt, "warmup_steps", 0, &t->warmup_steps, name, err) ||
        get_int(jt, "total_steps", 0, &t->total_steps, name, err) ||
        (json_object_get(jt, "warmup_ratio") && get_real(jt, "warmup_ratio", &t->warmup_ratio, name, err)) ||
        (json_object_get(jt, "warmup_round") &&
         get_str(jt, "warmup_round", t->warmup_round, sizeof t->warmup_round, name, err)) ||
        get_real(jt, "weight_decay", &t->weight_decay, name, err) ||
        get_real(jt, "eps", &t->eps, name, err) || get_real(jt, "clip_norm", &t->clip_norm, name, err) ||
        read_objective(t, jt, name, err))
        return -1;
    if (!json_is_array(betas) || json_array_size(betas) != 2 ||
        !json_is_number(json_array_get(betas, 0)) || !json_is_number(json_array_get(betas, 1)))
        return errf(err, "%s: \"train.betas\": not a pair of numbers", name);
    t->betas[0] = json_number_value(json_array_get(betas, 0));
    t->betas[1] = json_number_value(json_array_get(betas, 1));
    return 0;
}

static int read_files(ckpt_manifest *m, const json_t *files, const char *name, errbuf *err) {
    int n = m->layout.n_files;
    if (!json_is_array(files) || json_array_size(files) != (size_t)n)
        return errf(err, "%s: \"files\": not a list of %d files", name, n);
    m->files = calloc((size_t)n, sizeof *m->files);
    if (!m->files) return errf(err, "%s: out of memory", name);
    ckpt_file_header plan;
    if (ckpt_plan(&plan, &m->layout, 0, m->step, err)) return -1;
    uint64_t planned = plan.file_bytes;
    ckpt_file_header_free(&plan);
    for (int r = 0; r < n; r++) {
        const json_t *jf = json_array_get(files, (size_t)r);
        ckpt_file_entry *f = &m->files[r];
        uint64_t crc;
        char want[CKPT_NAME_MAX];
        if (get_str(jf, "name", f->name, sizeof f->name, name, err) ||
            get_int32(jf, "rank", 0, &f->rank, name, err) || get_u64(jf, "bytes", &f->bytes, name, err) ||
            get_u64(jf, "header_crc32c", &crc, name, err))
            return -1;
        if (crc > 0xffffffffu) return errf(err, "%s: file %s: header_crc32c out of range", name, f->name);
        f->header_crc = (uint32_t)crc;
        ckpt_file_name(want, sizeof want, r, n);
        if (f->rank != r || strcmp(f->name, want) != 0)
            return errf(err, "%s: files[%d] is %s (rank %d), expected %s", name, r, f->name, f->rank, want);
        if (f->bytes != planned)
            return errf(err, "%s: file %s: %llu bytes, but the layout gives %llu", name, f->name,
                        (unsigned long long)f->bytes, (unsigned long long)planned);
    }
    return 0;
}

int ckpt_manifest_parse(ckpt_manifest *m, const char *text, size_t len, const char *name,
                        errbuf *err) {
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return errf(err, "%s: not JSON (line %d: %s)", name, je.line, je.text);
    const char *format = json_string_value(json_object_get(root, "format"));
    int64_t version = 0;
    int n_files = 0, rc = -1;
    if (!json_is_object(root) || !format || strcmp(format, CKPT_FORMAT) != 0) {
        errf(err, "%s: not a checkpoint manifest (\"format\" is not \"%s\")", name, CKPT_FORMAT);
        goto out;
    }
    if (get_int(root, "version", 0, &version, name, err)) goto out;
    if (version != CKPT_VERSION) {
        errf(err, "%s: manifest version %lld (this build reads version %d)", name, (long long)version,
             CKPT_VERSION);
        goto out;
    }
    char dtype[8];
    if (get_int(root, "step", 0, &m->step, name, err) ||
        get_int(root, "optimizer_step", 0, &m->optimizer_step, name, err) ||
        get_int(root, "global_sample", 0, &m->global_sample, name, err) ||
        get_int(root, "tokens_seen", 0, &m->tokens_seen, name, err) ||
        get_int(root, "seed", 0, &m->seed, name, err) ||
        get_int32(root, "global_batch", 1, &m->global_batch, name, err) ||
        get_int32(root, "world_size", 1, &m->world_size, name, err) ||
        get_int32(root, "n_files", 1, &n_files, name, err) ||
        get_str(root, "sharding", m->sharding, sizeof m->sharding, name, err) ||
        get_str(root, "dtype", dtype, sizeof dtype, name, err) ||
        /* absent in manifests written before it existed: the model directory is unknown */
        (json_object_get(root, "model_path") &&
         get_str(root, "model_path", m->model_path, sizeof m->model_path, name, err)) ||
        read_train(&m->train, json_object_get(root, "train"), name, err) ||
        read_adapter(m, json_object_get(root, "adapter"), name, err) ||
        read_identity(m, json_object_get(root, "identity"), name, err))
        goto out;
    if (strcmp(dtype, "f32") != 0) {
        errf(err, "%s: dtype \"%s\" (only f32 is written)", name, dtype);
        goto out;
    }
    if (n_files > m->world_size) {
        errf(err, "%s: %d files from %d ranks", name, n_files, m->world_size);
        goto out;
    }
    if (m->global_sample != m->step * m->global_batch) {
        errf(err, "%s: global_sample %lld is not step %lld x global_batch %d", name,
             (long long)m->global_sample, (long long)m->step, m->global_batch);
        goto out;
    }
    m->model_config = json_incref(json_object_get(root, "model_config"));
    if (!json_is_object(m->model_config)) {
        errf(err, "%s: \"model_config\": missing or not an object", name);
        goto out;
    }
    if (ckpt_layout_from_json(&m->layout, json_object_get(root, "units"), n_files, name, err) ||
        read_files(m, json_object_get(root, "files"), name, err))
        goto out;
    rc = 0;
out:
    json_decref(root);
    if (rc) ckpt_manifest_free(m);
    return rc;
}

int ckpt_manifest_load(ckpt_manifest *m, const char *ckpt_path, errbuf *err) {
    char path[PATH_BYTES];
    memset(m, 0, sizeof *m);
    if (path_join(path, sizeof path, ckpt_path, CKPT_MANIFEST, err)) return -1;
    return ckpt_manifest_load_file(m, path, err);
}

int ckpt_manifest_load_file(ckpt_manifest *m, const char *path, errbuf *err) {
    char *text;
    size_t len;
    memset(m, 0, sizeof *m);
    if (file_read_all(path, CKPT_MANIFEST_MAX, &text, &len, err)) return -1;
    int rc = ckpt_manifest_parse(m, text, len, path, err);
    free(text);
    return rc;
}

void ckpt_manifest_free(ckpt_manifest *m) {
    json_decref(m->model_config);
    ckpt_layout_free(&m->layout);
    free(m->files);
    memset(m, 0, sizeof *m);
}

int ckpt_manifest_check_model(const ckpt_manifest *m, const llama_config *cfg, const char *name,
                              errbuf *err) {
    char *text = json_dumps(m->model_config, JSON_COMPACT);
    if (!text) return errf(err, "%s: out of memory", name);
    llama_config c;
    int rc = llama_config_parse(&c, text, strlen(text), name, err);
    free(text);
    if (rc) return -1;
    const struct {
        const char *key;
        double have, want;
    } fields[] = {
        {"hidden_size", c.hidden_size, cfg->hidden_size},
        {"intermediate_size", c.intermediate_size, cfg->intermediate_size},
        {"num_hidden_layers", c.num_hidden_layers, cfg->num_hidden_layers},
        {"num_attention_heads", c.num_attention_heads, cfg->num_attention_heads},
        {"num_key_value_heads", c.num_key_value_heads, cfg->num_key_value_heads},
        {"head_dim", c.head_dim, cfg->head_dim},
        {"vocab_size", c.vocab_size, cfg->vocab_size},
        {"max_position_embeddings", c.max_position_embeddings, cfg->max_position_embeddings},
        {"rms_norm_eps", c.rms_norm_eps, cfg->rms_norm_eps},
        {"tie_word_embeddings", c.tie_word_embeddings, cfg->tie_word_embeddings},
        {"rope type", c.rope.type, cfg->rope.type},
        {"rope_theta", c.rope.theta, cfg->rope.theta},
        {"rope factor", c.rope.factor, cfg->rope.factor},
        {"rope low_freq_factor", c.rope.low_freq_factor, cfg->rope.low_freq_factor},
        {"rope high_freq_factor", c.rope.high_freq_factor, cfg->rope.high_freq_factor},
        {"rope original_max_position_embeddings", c.rope.original_max_position_embeddings,
         cfg->rope.original_max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].have != fields[i].want)
            return errf(err, "%s: the checkpoint is of another model: %s %.17g, the job's model has %.17g",
                        name, fields[i].key, fields[i].have, fields[i].want);
    return 0;
}

/* ---- verification and reading ---- */

/* Opens file `file` and checks its header against the manifest and the planned layout. */
/* fd (named path) holds file `file` of m: its header read into h and checked against the
 * manifest's layout, step, size and header CRC. */
static int check_file(int fd, const char *path, const ckpt_manifest *m, int file, ckpt_file_header *h, errbuf *err) {
    const ckpt_file_entry *f = &m->files[file];
    ckpt_file_header plan;
    if (ckpt_read_header(h, fd, path, err)) return -1;
    int rc = ckpt_plan(&plan, &m->layout, file, m->step, err);
    if (rc == 0 && (h->rank != plan.rank || h->n_files != plan.n_files || h->n_units != plan.n_units))
        rc = errf(err, "%s: header says rank %u of %u files, %u units; the manifest says rank %d of %d, "
                       "%d units", path, h->rank, h->n_files, h->n_units, file, m->layout.n_files,
                  m->layout.n_units);
    if (rc == 0 && (h->step != plan.step || h->file_bytes != f->bytes))
        rc = errf(err, "%s: header says step %llu, %llu bytes; the manifest says step %lld, %llu bytes",
                  path, (unsigned long long)h->step, (unsigned long long)h->file_bytes,
                  (long long)m->step, (unsigned long long)f->bytes);
    for (int i = 0; rc == 0 && i < h->n_sections; i++)
        if (h->sections[i].offset != plan.sections[i].offset || h->sections[i].bytes != plan.sections[i].bytes)
            rc = errf(err, "%s: section %d is not where the manifest's layout puts it", path, i);
    if (rc == 0 && h->crc != f->header_crc)
        rc = errf(err, "%s: header CRC32C %08x, the manifest says %08x", path, h->crc, f->header_crc);
    ckpt_file_header_free(&plan);
    if (rc) ckpt_file_header_free(h);
    return rc;
}

static int open_checked(const char *ckpt_path, const ckpt_manifest *m, int file, int *fd_out,
                        ckpt_file_header *h, errbuf *err) {
    char path[PATH_BYTES];
    *fd_out = -1;
    if (path_join(path, sizeof path, ckpt_path, m->files[file].name, err)) return -1;
    int fd = file_open_regular(path, err);
    if (fd < 0) return access(path, F_OK) != 0 ? errf(err, "%s: missing", path) : -1;
    if (check_file(fd, path, m, file, h, err)) {
        close(fd);
        return -1;
    }
    *fd_out = fd;
    return 0;
}

int ckpt_check_fd(int fd, const char *name, const ckpt_manifest *m, int file, errbuf *err) {
    ckpt_file_header h;
    if (check_file(fd, name, m, file, &h, err)) return -1;
    ckpt_file_header_free(&h);
    return 0;
}

int ckpt_find_image(const int fd[2], const ckpt_manifest *m, int file, errbuf *err) {
    char name[CKPT_NAME_MAX + 16];
    errbuf first;
    snprintf(name, sizeof name, "the image of %s", m->files[file].name);
    if (ckpt_check_fd(fd[0], name, m, file, &first) == 0) return 0;
    if (ckpt_check_fd(fd[1], name, m, file, err) == 0) return 1;
    char second[sizeof err->msg];
    snprintf(second, sizeof second, "%s", err->msg);
    errf(err, "%s (its other image: %s)", first.msg, second);
    return -1;
}

int ckpt_reader_adopt(ckpt_reader *r, int file, int fd, const char *name, errbuf *err) {
    if (file < 0 || file >= r->m->layout.n_files || r->fds[file] >= 0)
        return errf(err, "%s: file %d cannot be read from it", name, file);
    if (check_file(fd, name, r->m, file, &r->headers[file], err)) return -1;
    r->fds[file] = fd;
    return 0;
}

/* Reads section s of fd whole in chunks, checking its CRC; for each chunk calls copy (when
 * not NULL) with the chunk's byte offset inside the section. */
typedef void (*chunk_fn)(void *arg, const void *chunk, uint64_t at, size_t n);

static int read_section(int fd, const char *path, const ckpt_section *s, void *buf, size_t buf_bytes,
                        chunk_fn fn, void *arg, errbuf *err) {
    uint32_t crc = 0;
    for (uint64_t at = 0; at < s->bytes; at += buf_bytes) {
        size_t n = s->bytes - at < buf_bytes ? (size_t)(s->bytes - at) : buf_bytes;
        if (file_pread_full(fd, buf, n, s->offset + at, path, err)) return -1;
        crc = crc32c(crc, buf, n);
        if (fn) fn(arg, buf, at, n);
    }
    if (crc != s->crc)
        return errf(err, "%s: section %s of unit %u: CRC32C mismatch (stored %08x, computed %08x): the "
                         "file is corrupt", path, ckpt_kind_name((int)s->kind), s->unit, s->crc, crc);
    return 0;
}

int ckpt_verify_file(const char *ckpt_path, const ckpt_manifest *m, int file, int check_data,
                     errbuf *err) {
    int fd;
    ckpt_file_header h;
    if (open_checked(ckpt_path, m, file, &fd, &h, err)) return -1;
    char path[PATH_BYTES];
    int rc = path_join(path, sizeof path, ckpt_path, m->files[file].name, err);
    void *buf = check_data && rc == 0 ? malloc(READ_CHUNK) : NULL;
    if (check_data && rc == 0 && !buf) rc = errf(err, "%s: out of memory", path);
    for (int i = 0; check_data && rc == 0 && i < h.n_sections; i++)
        rc = read_section(fd, path, &h.sections[i], buf, READ_CHUNK, NULL, NULL, err);
    free(buf);
    ckpt_file_header_free(&h);
    close(fd);
    return rc;
}

int ckpt_verify(const char *ckpt_path, const ckpt_manifest *m, int check_data, errbuf *err) {
    for (int f = 0; f < m->layout.n_files; f++)
        if (ckpt_verify_file(ckpt_path, m, f, check_data, err)) return -1;
    return 0;
}

int ckpt_reader_open(ckpt_reader *r, const char *ckpt_path, const ckpt_manifest *m, errbuf *err) {
    memset(r, 0, sizeof *r);
    int n = m->layout.n_files, ns = CKPT_KINDS * m->layout.n_units;
    r->m = m;
    r->path = strdup(ckpt_path);
    r->fds = malloc((size_t)n * sizeof *r->fds);
    r->headers = calloc((size_t)n, sizeof *r->headers);
    r->verified = calloc((size_t)n * (size_t)ns, 1);
    r->chunk_bytes = READ_CHUNK;
    r->chunk = malloc(r->chunk_bytes);
    if (!r->path || !r->fds || !r->headers || !r->verified || !r->chunk) {
        ckpt_reader_close(r);
        return errf(err, "%s: out of memory", ckpt_path);
    }
    for (int f = 0; f < n; f++) r->fds[f] = -1;
    return 0;
}

void ckpt_reader_close(ckpt_reader *r) {
    for (int f = 0; r->fds && r->headers && f < r->m->layout.n_files; f++) {
        if (r->fds[f] >= 0) close(r->fds[f]);
        ckpt_file_header_free(&r->headers[f]);
    }
    free(r->path);
    free(r->fds);
    free(r->headers);
    free(r->verified);
    free(r->chunk);
    memset(r, 0, sizeof *r);
}

/* Copies the part of a section chunk that falls in the wanted byte range [lo, hi) of the
 * section to dst (which starts at section byte lo). */
typedef struct range_copy {
    uint64_t lo, hi;
    uint8_t *dst;
} range_copy;

static void copy_overlap(void *arg, const void *chunk, uint64_t at, size_t n) {
    const range_copy *c = arg;
    uint64_t a = at > c->lo ? at : c->lo, b = at + n < c->hi ? at + n : c->hi;
    if (a < b) memcpy(c->dst + (a - c->lo), (const uint8_t *)chunk + (a - at), (size_t)(b - a));
}

int ckpt_read_range(ckpt_reader *r, int kind, int unit, uint64_t first, uint64_t n, float *dst,
                    errbuf *err) {
    const ckpt_layout *lo = &r->m->layout;
    if (kind < 1 || kind > CKPT_KINDS || unit < 0 || unit >= lo->n_units)
        return errf(err, "%s: no section %s of unit %d", r->path, ckpt_kind_name(kind), unit);
    const ckpt_unit *U = &lo->units[unit];
    uint64_t end = first + n, stop = end < U->numel ? end : U->numel;
    for (uint64_t i = first > stop ? first : stop; i < end; i++) dst[i - first] = 0.0f;
    int ns = CKPT_KINDS * lo->n_units, idx = ckpt_section_index(lo->n_units, kind, unit);
    for (uint64_t at = first; at < stop;) {
        int f = (int)(at / U->shard);
        uint64_t base = (uint64_t)f * U->shard, upto = base + U->shard < stop ? base + U->shard : stop;
        char path[PATH_BYTES];
        if (path_join(path, sizeof path, r->path, r->m->files[f].name, err)) return -1;
        if (r->fds[f] < 0 && open_checked(r->path, r->m, f, &r->fds[f], &r->headers[f], err)) return -1;
        const ckpt_section *s = &r->headers[f].sections[idx];
        range_copy c = {(at - base) * sizeof(float), (upto - base) * sizeof(float), (uint8_t *)(dst + (at - first))};
        uint8_t *seen = &r->verified[(size_t)f * (size_t)ns + (size_t)idx];
        if (!*seen) {
            if (read_section(r->fds[f], path, s, r->chunk, r->chunk_bytes, copy_overlap, &c, err)) return -1;
            *seen = 1;
        } else if (file_pread_full(r->fds[f], c.dst, (size_t)(c.hi - c.lo), s->offset + c.lo, path, err)) {
            return -1;
        }
        at = upto;
    }
    return 0;
}

/* ---- identity ---- */

typedef struct differ {
    ckpt_difference *out;
    int n;
} differ;

static void differ_add(differ *d, const char *field, int allowed, const char *fmt_ckpt, const char *fmt_job) {
    if (d->n < CKPT_MAX_DIFFERENCES) {
        ckpt_difference *x = &d->out[d->n];
        snprintf(x->field, sizeof x->field, "%s", field);
        snprintf(x->checkpoint, sizeof x->checkpoint, "%s", fmt_ckpt);
        snprintf(x->job, sizeof x->job, "%s", fmt_job);
        x->allowed = allowed;
    }
    d->n++;
}

static void diff_str(differ *d, const char *field, const char *ckpt, const char *job) {
    if (strcmp(ckpt, job)) differ_add(d, field, 0, ckpt[0] ? ckpt : "(none)", job[0] ? job : "(none)");
}

static void diff_num(differ *d, const char *field, double ckpt, double job, int allowed) {
    char a[48], b[48];
    if (ckpt == job) return;
    snprintf(a, sizeof a, "%.17g", ckpt);
    snprintf(b, sizeof b, "%.17g", job);
    differ_add(d, field, allowed, a, b);
}

static void diff_identity(differ *d, const ckpt_identity *c, const ckpt_identity *j) {
    diff_str(d, "train.type", c->train_type, j->train_type);
    diff_str(d, "model (fingerprint)", c->model_fingerprint, j->model_fingerprint);
    diff_str(d, "tokenizer (sha256)", c->data.tokenizer_sha256, j->data.tokenizer_sha256);
    diff_str(d, "optimizer", c->optimizer, j->optimizer);
    diff_str(d, "data (source)", c->data.source, j->data.source);
    diff_str(d, "data (sha256)", c->data.sha256, j->data.sha256);
    diff_str(d, "data.format", c->data_format, j->data_format);
    diff_str(d, "data.template", c->data_template, j->data_template);
    diff_num(d, "data.seq_len", c->seq_len, j->seq_len, 0);
    diff_num(d, "data.packing", c->packing, j->packing, 0);
    diff_num(d, "data.shuffle", c->shuffle, j->shuffle, 0);
    diff_num(d, "data.eval_fraction", c->eval_fraction, j->eval_fraction, 0);
    diff_num(d, "train.max_steps", c->max_steps, j->max_steps, 1);
    diff_num(d, "train.epochs", c->epochs, j->epochs, 1);
}

static void diff_train(differ *d, const ckpt_train_settings *c, const ckpt_train_settings *j) {
    diff_num(d, "train.lr", c->lr, j->lr, 0);
    diff_num(d, "train.min_lr", c->min_lr, j->min_lr, 0);
    diff_str(d, "train.schedule", c->schedule, j->schedule);
    diff_num(d, "train.warmup_steps", c->warmup_steps, j->warmup_steps, 0);
    diff_num(d, "train.warmup_ratio", c->warmup_ratio, j->warmup_ratio, 0);
    diff_str(d, "train.warmup_round", c->warmup_round, j->warmup_round);
    diff_num(d, "train.weight_decay", c->weight_decay, j->weight_decay, 0);
    diff_num(d, "train.betas[0]", c->betas[0], j->betas[0], 0);
    diff_num(d, "train.betas[1]", c->betas[1], j->betas[1], 0);
    diff_num(d, "train.eps", c->eps, j->eps, 0);
    diff_num(d, "train.clip_norm", c->clip_norm, j->clip_norm, 0);
    diff_str(d, "train.objective", c->objective, j->objective);
    diff_num(d, "train.dpo_beta", c->dpo_beta, j->dpo_beta, 0);
    diff_str(d, "train.dpo_loss", c->dpo_loss, j->dpo_loss);
    diff_num(d, "train.dpo_label_smoothing", c->dpo_label_smoothing, j->dpo_label_smoothing, 0);
    diff_num(d, "train.orpo_lambda", c->orpo_lambda, j->orpo_lambda, 0);
}

int ckpt_identity_compare(const ckpt_manifest *m, const ckpt_identity *id, const ckpt_train_settings *train,
                          const ckpt_adapter *adapter, ckpt_difference *out) {
    differ d = {out, 0};
    if (!m->has_identity) differ_add(&d, "identity", 0, "(not recorded: written before fsdpd recorded it)", "this job's");
    else diff_identity(&d, &m->identity, id);
    diff_train(&d, &m->train, train);
    if (adapter && m->has_adapter) {
        diff_str(&d, "adapter type (train.type)", m->adapter.type, adapter->type);
        diff_num(&d, "lora.alpha", m->adapter.lora.alpha, adapter->lora.alpha, 0);
        diff_num(&d, "lora.dropout", m->adapter.lora.dropout, adapter->lora.dropout, 0);
        diff_num(&d, "lora.rslora", m->adapter.lora.rslora, adapter->lora.rslora, 0);
    }
    return d.n;
}

/* ---- the checkpoint directory ---- */

/* dir/name is a committed checkpoint: it holds a manifest. */
static int is_committed(const char *dir, const char *name) {
    char path[PATH_BYTES];
    struct stat st;
    return fits(snprintf(path, sizeof path, "%s/%s/%s", dir, name, CKPT_MANIFEST), sizeof path) &&
           stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* readlink said EINVAL: latest exists but is not a symbolic link (a file copied in place of it,
 * say); say what it is and what it should be. */
static int not_a_link(const char *link, errbuf *err) {
    struct stat st;
    const char *what = lstat(link, &st) == 0 ? file_type_name(st.st_mode) : "not a symbolic link";
    return errf(err, "%s: is %s; it should be a symbolic link to a step-N directory (fsdpd "
                     "makes it: remove it, or make it one with ln -sfn step-N %s)", link, what,
                link);
}

int ckpt_resolve(const char *dir, job_resume mode, int64_t resume_step, char *out, size_t n,
                 errbuf *err) {
    char name[256];
    if (mode == JOB_RESUME_NEVER) return 0;
    if (mode == JOB_RESUME_FORCE) mode = JOB_RESUME_LATEST;
    if (mode == JOB_RESUME_STEP) {
        if (ckpt_step_name(name, sizeof name, resume_step)) return errf(err, "step %lld: bad step", (long long)resume_step);
    } else {
        char link[PATH_BYTES];
        if (path_join(link, sizeof link, dir, CKPT_LATEST, err)) return -1;
        ssize_t len = readlink(link, name, sizeof name - 1);
        if (len < 0 && errno == ENOENT && mode == JOB_RESUME_AUTO) return 0;
        if (len < 0 && errno == ENOENT) return errf(err, "%s: no checkpoint to resume from", link);
        if (len < 0 && errno == EINVAL) return not_a_link(link, err);
        if (len < 0) return errf(err, "%s: %s", link, strerror(errno));
        name[len] = '\0';
        int64_t step;
        if (!ckpt_parse_step_name(name, &step))
            return errf(err, "%s: points to '%s', not a step-N directory", link, name);
    }
    if (path_join(out, n, dir, name, err)) return -1;
    if (!is_committed(dir, name))
        return errf(err, "%s: not a committed checkpoint (no %s)", out, CKPT_MANIFEST);
    return 1;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int ckpt_list(const char *dir, int64_t **steps, int *n, errbuf *err) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : errf(err, "%s: %s", dir, strerror(errno));
    size_t cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step;
        if (!ckpt_parse_step_name(e->d_name, &step) || !is_committed(dir, e->d_name)) continue;
        if ((size_t)*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *bigger = realloc(*steps, cap * sizeof *bigger);
            if (!bigger) {
                rc = errf(err, "%s: out of memory", dir);
                break;
            }
            *steps = bigger;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return -1;
    }
    if (*n > 1) qsort(*steps, (size_t)*n, sizeof **steps, cmp_i64);
    return 0;
}
