#include "model_image.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "rng.h"

#define IMAGE_MAGIC "FSDPMIMG"
#define IMAGE_ALIGN 4096
#define IMAGE_FIXED 32
#define IMAGE_CHUNK (1u << 20) /* elements converted at a time */

static size_t align_up(size_t n) { return (n + IMAGE_ALIGN - 1) / IMAGE_ALIGN * IMAGE_ALIGN; }
static size_t elem_bytes(model_image_dtype dt) { return dt == MODEL_IMAGE_BF16 ? 2 : 4; }
static size_t header_bytes(int n_units) { return align_up(IMAGE_FIXED + 16 * (size_t)n_units); }

/* Byte offset of unit u's data. */
static size_t unit_offset(const llama_layout *lo, model_image_dtype dt, int u) {
    size_t at = header_bytes(lo->n_units);
    for (int i = 0; i < u; i++) at += align_up(lo->units[i].numel * elem_bytes(dt));
    return at;
}

size_t model_image_bytes(const llama_layout *lo, model_image_dtype dt) {
    return unit_offset(lo, dt, lo->n_units);
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void write_header(unsigned char *image, const llama_layout *lo, model_image_dtype dt) {
    memset(image, 0, header_bytes(lo->n_units));
    memcpy(image, IMAGE_MAGIC, 8);
    put_u32(image + 8, 1);
    put_u32(image + 12, dt);
    put_u32(image + 16, (uint32_t)lo->n_units);
    put_u64(image + 24, model_image_bytes(lo, dt));
    for (int u = 0; u < lo->n_units; u++) {
        put_u64(image + IMAGE_FIXED + 16 * (size_t)u, unit_offset(lo, dt, u));
        put_u64(image + IMAGE_FIXED + 16 * (size_t)u + 8, lo->units[u].numel);
    }
}

/* Stores src[n] (fp32) as element `at` onwards of a unit's data in dtype dt. */
static void store(unsigned char *unit_data, model_image_dtype dt, size_t at, const float *src,
                  size_t n) {
    if (dt == MODEL_IMAGE_F32) {
        memcpy(unit_data + at * 4, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h = st_f32_to_bf16(src[i]);
        memcpy(unit_data + (at + i) * 2, &h, 2);
    }
}

/* Fills every tensor chunk by chunk from fill(slot index, first, n, dst). */
typedef int (*tensor_fill)(const llama_layout *lo, int slot, size_t first, size_t n, float *dst,
                           const void *arg, errbuf *err);

static int fill_image(void *image, const llama_layout *lo, model_image_dtype dt, tensor_fill fill,
                      const void *fill_arg, model_image_progress progress, void *arg,
                      errbuf *err) {
    float *chunk = malloc(IMAGE_CHUNK * sizeof *chunk);
    if (!chunk) return errf(err, "model image: out of memory");
    write_header(image, lo, dt);
    for (int u = 0; u < lo->n_units; u++) { /* the alignment padding after each unit */
        size_t end = unit_offset(lo, dt, u) + lo->units[u].numel * elem_bytes(dt);
        memset((unsigned char *)image + end, 0, unit_offset(lo, dt, u + 1) - end);
    }
    size_t total = model_image_bytes(lo, dt), done = 0;
    int rc = 0;
    for (int i = 0; i < lo->n_tensors && rc == 0; i++) {
        const llama_tensor_slot *s = &lo->tensors[i];
        unsigned char *data = (unsigned char *)image + unit_offset(lo, dt, s->unit);
        for (size_t first = 0; first < s->numel && rc == 0; first += IMAGE_CHUNK) {
            size_t n = s->numel - first < IMAGE_CHUNK ? s->numel - first : IMAGE_CHUNK;
            rc = fill(lo, i, first, n, chunk, fill_arg, err);
            if (rc == 0) store(data, dt, s->offset + first, chunk, n);
            done += n * elem_bytes(dt);
            if (progress) progress(arg, done, total);
        }
    }
    free(chunk);
    return rc;
}

static int fill_from_checkpoint(const llama_layout *lo, int slot, size_t first, size_t n,
                                float *dst, const void *arg, errbuf *err) {
    const st_tensor *t = llama_checkpoint_tensor(&lo->tensors[slot], arg, err);
    return t ? st_read_f32(t, first, n, dst, err) : -1;
}

int model_image_fill_hf(void *image, const llama_layout *lo, model_image_dtype dt,
                        const st_model *st, model_image_progress progress, void *arg,
                        errbuf *err) {
    return fill_image(image, lo, dt, fill_from_checkpoint, st, progress, arg, err);
}

static int fill_random(const llama_layout *lo, int slot, size_t first, size_t n, float *dst,
                       const void *arg, errbuf *err) {
    (void)err;
    if (lo->tensors[slot].is_norm) {
        for (size_t i = 0; i < n; i++) dst[i] = 1.0f;
    } else {
        rng_fill_normal(dst, n, (float)lo->cfg.initializer_range, *(const uint64_t *)arg,
                        rng_stream(RNG_PURPOSE_INIT, (uint64_t)slot), first);
    }
    return 0;
}

int model_image_fill_random(void *image, const llama_layout *lo, model_image_dtype dt,
                            uint64_t seed, model_image_progress progress, void *arg,
                            errbuf *err) {
    return fill_image(image, lo, dt, fill_random, &seed, progress, arg, err);
}

int model_image_check(const void *image, size_t len, const llama_layout *lo, errbuf *err) {
    const unsigned char *p = image;
    size_t hb = header_bytes(lo->n_units);
    if (len < hb || memcmp(p, IMAGE_MAGIC, 8) != 0) return errf(err, "model image: bad header");
    if (get_u32(p + 8) != 1) return errf(err, "model image: version %u", get_u32(p + 8));
    model_image_dtype dt = (model_image_dtype)get_u32(p + 12);
    if (dt != MODEL_IMAGE_F32 && dt != MODEL_IMAGE_BF16)
        return errf(err, "model image: unknown dtype %u", (unsigned)dt);
    if (get_u32(p + 16) != (uint32_t)lo->n_units)
        return errf(err, "model image: %u units, the model has %d", get_u32(p + 16), lo->n_units);
    if (get_u64(p + 24) != model_image_bytes(lo, dt) || len < model_image_bytes(lo, dt))
        return errf(err, "model image: %zu bytes, the model needs %zu", len,
                    model_image_bytes(lo, dt));
    for (int u = 0; u < lo->n_units; u++)
        if (get_u64(p + IMAGE_FIXED + 16 * (size_t)u) != unit_offset(lo, dt, u) ||
            get_u64(p + IMAGE_FIXED + 16 * (size_t)u + 8) != lo->units[u].numel)
            return errf(err, "model image: unit %d does not match the model's layout", u);
    return 0;
}

void model_image_read_f32(const void *image, const llama_layout *lo, int unit, size_t first,
                          size_t n, float *dst) {
    const unsigned char *p = image;
    model_image_dtype dt = (model_image_dtype)get_u32(p + 12);
    const unsigned char *data = p + unit_offset(lo, dt, unit);
    if (dt == MODEL_IMAGE_F32) {
        memcpy(dst, data + first * 4, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, data + (first + i) * 2, 2);
        dst[i] = st_bf16_to_f32(h);
    }
}

int model_image_map(int fd, const llama_layout *lo, const void **image, size_t *bytes,
                    errbuf *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return errf(err, "model memory (fd %d): %s", fd, strerror(errno));
    size_t n = (size_t)st.st_size;
    void *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return errf(err, "mapping the model memory: %s", strerror(errno));
    if (model_image_check(p, n, lo, err)) {
        munmap(p, n);
        return -1;
    }
    *image = p;
    *bytes = n;
    return 0;
}
