#include "model_image.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/bytes.h"
#include "rng.h"

#define IMAGE_MAGIC "FSDPMIMG"
#define IMAGE_ALIGN 4096
#define IMAGE_FIXED 32
#define IMAGE_CHUNK (1u << 20) /* elements converted at a time */
#define IMAGE_MAX_THREADS 64

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


static void write_header(unsigned char *image, const llama_layout *lo, model_image_dtype dt) {
    memset(image, 0, header_bytes(lo->n_units));
    memcpy(image, IMAGE_MAGIC, 8);
    le_put_u32(image + 8, 1);
    le_put_u32(image + 12, dt);
    le_put_u32(image + 16, (uint32_t)lo->n_units);
    le_put_u64(image + 24, model_image_bytes(lo, dt));
    for (int u = 0; u < lo->n_units; u++) {
        le_put_u64(image + IMAGE_FIXED + 16 * (size_t)u, unit_offset(lo, dt, u));
        le_put_u64(image + IMAGE_FIXED + 16 * (size_t)u + 8, lo->units[u].numel);
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
        uint16_t h = bf16_from_f32(src[i]);
        memcpy(unit_data + (at + i) * 2, &h, 2);
    }
}

/* Fills every tensor chunk by chunk from fill(slot index, first, n, dst), on every core: a
 * 70B model is 70 billion draws or conversions. */
typedef int (*tensor_fill)(const llama_layout *lo, int slot, size_t first, size_t n, float *dst,
                           const void *arg, errbuf *err);

typedef struct fill_chunk {
    int slot;
    size_t first, n;
} fill_chunk;

typedef struct fill_job {
    unsigned char *image;
    const llama_layout *lo;
    model_image_dtype dt;
    tensor_fill fill;
    const void *fill_arg;
    fill_chunk *chunks;
    size_t n_chunks;
    atomic_size_t next, done_bytes;
    atomic_int failed;
    pthread_mutex_t lock; /* guards err */
    errbuf *err;
} fill_job;

/* Takes chunks until none is left; only the calling thread is given `progress`. */
static void fill_chunks(fill_job *job, model_image_progress progress, void *arg) {
    float *buf = malloc(IMAGE_CHUNK * sizeof *buf);
    errbuf err;
    int rc = buf ? 0 : errf(&err, "model image: out of memory");
    size_t total = model_image_bytes(job->lo, job->dt);
    for (size_t i; rc == 0 && !atomic_load(&job->failed) && (i = atomic_fetch_add(&job->next, 1)) < job->n_chunks;) {
        const fill_chunk *c = &job->chunks[i];
        const llama_tensor_slot *s = &job->lo->tensors[c->slot];
        rc = job->fill(job->lo, c->slot, c->first, c->n, buf, job->fill_arg, &err);
        if (rc == 0) store(job->image + unit_offset(job->lo, job->dt, s->unit), job->dt, s->offset + c->first, buf, c->n);
        size_t done = atomic_fetch_add(&job->done_bytes, c->n * elem_bytes(job->dt)) + c->n * elem_bytes(job->dt);
        if (progress) progress(arg, done, total);
    }
    if (rc) {
        pthread_mutex_lock(&job->lock);
        if (!atomic_exchange(&job->failed, 1) && job->err) *job->err = err;
        pthread_mutex_unlock(&job->lock);
    }
    free(buf);
}

static void *fill_thread(void *arg) {
    fill_chunks(arg, NULL, NULL);
    return NULL;
}

static int fill_image(void *image, const llama_layout *lo, model_image_dtype dt, tensor_fill fill,
                      const void *fill_arg, model_image_progress progress, void *arg,
                      errbuf *err) {
    size_t n_chunks = 0;
    for (int i = 0; i < lo->n_tensors; i++) n_chunks += (lo->tensors[i].numel + IMAGE_CHUNK - 1) / IMAGE_CHUNK;
    fill_job job = {.image = image, .lo = lo, .dt = dt, .fill = fill, .fill_arg = fill_arg,
                    .n_chunks = n_chunks, .err = err, .lock = PTHREAD_MUTEX_INITIALIZER};
    job.chunks = malloc((n_chunks ? n_chunks : 1) * sizeof *job.chunks);
    if (!job.chunks) return errf(err, "model image: out of memory");
    size_t k = 0;
    for (int i = 0; i < lo->n_tensors; i++)
        for (size_t first = 0; first < lo->tensors[i].numel; first += IMAGE_CHUNK) {
            size_t left = lo->tensors[i].numel - first;
            job.chunks[k++] = (fill_chunk){i, first, left < IMAGE_CHUNK ? left : IMAGE_CHUNK};
        }
    write_header(image, lo, dt);
    for (int u = 0; u < lo->n_units; u++) { /* the alignment padding after each unit */
        size_t end = unit_offset(lo, dt, u) + lo->units[u].numel * elem_bytes(dt);
        memset((unsigned char *)image + end, 0, unit_offset(lo, dt, u + 1) - end);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cores > 1 ? (cores > IMAGE_MAX_THREADS ? IMAGE_MAX_THREADS : (int)cores) - 1 : 0;
    if ((size_t)n_threads > n_chunks) n_threads = (int)n_chunks;
    pthread_t threads[IMAGE_MAX_THREADS];
    int started = 0;
    while (started < n_threads && pthread_create(&threads[started], NULL, fill_thread, &job) == 0) started++;
    fill_chunks(&job, progress, arg); /* fewer threads than asked for only makes it slower */
    for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
    free(job.chunks);
    return atomic_load(&job.failed) ? -1 : 0;
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
    if (le_get_u32(p + 8) != 1) return errf(err, "model image: version %u", le_get_u32(p + 8));
    model_image_dtype dt = (model_image_dtype)le_get_u32(p + 12);
    if (dt != MODEL_IMAGE_F32 && dt != MODEL_IMAGE_BF16)
        return errf(err, "model image: unknown dtype %u", (unsigned)dt);
    if (le_get_u32(p + 16) != (uint32_t)lo->n_units)
        return errf(err, "model image: %u units, the model has %d", le_get_u32(p + 16), lo->n_units);
    if (le_get_u64(p + 24) != model_image_bytes(lo, dt) || len < model_image_bytes(lo, dt))
        return errf(err, "model image: %zu bytes, the model needs %zu", len,
                    model_image_bytes(lo, dt));
    for (int u = 0; u < lo->n_units; u++)
        if (le_get_u64(p + IMAGE_FIXED + 16 * (size_t)u) != unit_offset(lo, dt, u) ||
            le_get_u64(p + IMAGE_FIXED + 16 * (size_t)u + 8) != lo->units[u].numel)
            return errf(err, "model image: unit %d does not match the model's layout", u);
    return 0;
}

void model_image_read_f32(const void *image, const llama_layout *lo, int unit, size_t first,
                          size_t n, float *dst) {
    const unsigned char *p = image;
    model_image_dtype dt = (model_image_dtype)le_get_u32(p + 12);
    const unsigned char *data = p + unit_offset(lo, dt, unit);
    if (dt == MODEL_IMAGE_F32) {
        memcpy(dst, data + first * 4, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, data + (first + i) * 2, 2);
        dst[i] = bf16_to_f32(h);
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
