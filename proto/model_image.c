/* model_image: a whole model in flat-parameter order, as node-shared memory holds it; see model_image.h. */
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
#include "nf4.h"
#include "rng.h"

#define IMAGE_MAGIC "FSDPMIMG"
#define IMAGE_ALIGN 4096
#define IMAGE_FIXED 32
#define IMAGE_CHUNK MODEL_IMAGE_CHUNK
#define IMAGE_MAX_THREADS MODEL_IMAGE_MAX_THREADS
_Static_assert(IMAGE_CHUNK % NF4_BLOCK == 0, "an NF4 image's chunks are whole blocks");

static size_t align_up(size_t n) { return (n + IMAGE_ALIGN - 1) / IMAGE_ALIGN * IMAGE_ALIGN; }
static size_t align64(size_t n) { return (n + 63) / 64 * 64; }
static size_t elem_bytes(model_image_dtype dt) { return dt == MODEL_IMAGE_BF16 ? 2 : 4; }
static size_t header_bytes(int n_units) { return align_up(IMAGE_FIXED + 16 * (size_t)n_units); }

static int is_layer(const llama_layout *lo, int u) { return u >= 1 && u <= lo->n_layers; }

void model_image_nf4_layer_of(const llama_layout *lo, model_image_dtype dt, model_image_quant q,
                              model_image_nf4_layer *out) {
    memset(out, 0, sizeof *out);
    const llama_tensor_slot *t = &lo->tensors[lo->units[llama_layer_unit(0)].first];
    for (int i = 0; i < MODEL_IMAGE_LINEARS; i++) {
        out->t_numel[i] = t[i].numel;
        out->t_packed[i] = out->packed_bytes;
        out->t_block[i] = out->absmax_bytes / (q == MODEL_IMAGE_NF4_DQ ? 1 : 4);
        out->t_nested[i] = out->n_nested;
        uint64_t blocks = nf4_blocks(t[i].numel);
        out->packed_bytes += nf4_packed_bytes(t[i].numel);
        out->absmax_bytes += blocks * (q == MODEL_IMAGE_NF4_DQ ? 1 : 4);
        out->n_nested += q == MODEL_IMAGE_NF4_DQ ? (blocks + NF4_NESTED_BLOCK - 1) / NF4_NESTED_BLOCK : 0;
    }
    out->n_plain = lo->units[llama_layer_unit(0)].numel - t[MODEL_IMAGE_LINEARS].offset;
    size_t norms = out->n_plain * elem_bytes(dt);
    out->norms = 0;
    out->packed = align64(norms);
    out->absmax = align64(out->packed + out->packed_bytes);
    out->nested = align64(out->absmax + out->absmax_bytes);
    out->offsets = align64(out->nested + out->n_nested * sizeof(float));
    out->bytes = out->offsets + (q == MODEL_IMAGE_NF4_DQ ? MODEL_IMAGE_LINEARS * sizeof(float) : 0);
}

/* Bytes of unit u's data. */
static size_t unit_bytes(const llama_layout *lo, model_image_dtype dt, model_image_quant q, int u) {
    if (q == MODEL_IMAGE_PLAIN || !is_layer(lo, u)) return lo->units[u].numel * elem_bytes(dt);
    model_image_nf4_layer nl;
    model_image_nf4_layer_of(lo, dt, q, &nl);
    return nl.bytes;
}

/* Byte offset of unit u's data. */
static size_t unit_offset(const llama_layout *lo, model_image_dtype dt, model_image_quant q, int u) {
    size_t at = header_bytes(lo->n_units);
    for (int i = 0; i < u; i++) at += align_up(unit_bytes(lo, dt, q, i));
    return at;
}

size_t model_image_bytes_q(const llama_layout *lo, model_image_dtype dt, model_image_quant q) {
    return unit_offset(lo, dt, q, lo->n_units);
}

size_t model_image_bytes(const llama_layout *lo, model_image_dtype dt) {
    return model_image_bytes_q(lo, dt, MODEL_IMAGE_PLAIN);
}

static void write_header(unsigned char *image, const llama_layout *lo, model_image_dtype dt,
                         model_image_quant q) {
    memset(image, 0, header_bytes(lo->n_units));
    memcpy(image, IMAGE_MAGIC, 8);
    le_put_u32(image + 8, 1);
    le_put_u32(image + 12, dt);
    le_put_u32(image + 16, (uint32_t)lo->n_units);
    le_put_u32(image + 20, q);
    le_put_u64(image + 24, model_image_bytes_q(lo, dt, q));
    for (int u = 0; u < lo->n_units; u++) {
        le_put_u64(image + IMAGE_FIXED + 16 * (size_t)u, unit_offset(lo, dt, q, u));
        le_put_u64(image + IMAGE_FIXED + 16 * (size_t)u + 8, lo->units[u].numel);
    }
    for (int u = 0; u < lo->n_units; u++) { /* the alignment padding after each unit */
        size_t end = unit_offset(lo, dt, q, u) + unit_bytes(lo, dt, q, u);
        memset(image + end, 0, unit_offset(lo, dt, q, u + 1) - end);
    }
}

model_image_dtype model_image_dtype_of(const void *image) {
    return (model_image_dtype)le_get_u32((const unsigned char *)image + 12);
}

model_image_quant model_image_quant_of(const void *image) {
    return (model_image_quant)le_get_u32((const unsigned char *)image + 20);
}

const unsigned char *model_image_unit(const void *image, const llama_layout *lo, int u) {
    return (const unsigned char *)image +
           unit_offset(lo, model_image_dtype_of(image), model_image_quant_of(image), u);
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

int model_image_fill_threads(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 1 ? (cores > IMAGE_MAX_THREADS ? IMAGE_MAX_THREADS : (int)cores) : 1;
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
        if (rc == 0) store(job->image + unit_offset(job->lo, job->dt, MODEL_IMAGE_PLAIN, s->unit), job->dt, s->offset + c->first, buf, c->n);
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
    write_header(image, lo, dt, MODEL_IMAGE_PLAIN);
    int n_threads = model_image_fill_threads() - 1; /* besides the calling thread */
    if ((size_t)n_threads > n_chunks) n_threads = (int)n_chunks;
    pthread_t threads[IMAGE_MAX_THREADS];
    int started = 0;
    while (started < n_threads && pthread_create(&threads[started], NULL, fill_thread, &job) == 0) started++;
    fill_chunks(&job, progress, arg); /* fewer threads than asked for only makes it slower */
    for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
    free(job.chunks);
    if (atomic_load(&job.failed)) return -1;
    if (progress) progress(arg, model_image_bytes(lo, dt), model_image_bytes(lo, dt)); /* the end, whoever filled it */
    return 0;
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
    const llama_tensor_slot *t = &lo->tensors[slot];
    if (t->is_norm || t->is_bias) {
        for (size_t i = 0; i < n; i++) dst[i] = t->is_norm ? 1.0f : 0.0f;
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
    model_image_quant q = (model_image_quant)le_get_u32(p + 20);
    if (dt != MODEL_IMAGE_F32 && dt != MODEL_IMAGE_BF16)
        return errf(err, "model image: unknown dtype %u", (unsigned)dt);
    if (q != MODEL_IMAGE_PLAIN && q != MODEL_IMAGE_NF4 && q != MODEL_IMAGE_NF4_DQ)
        return errf(err, "model image: unknown quantization %u", (unsigned)q);
    if (le_get_u32(p + 16) != (uint32_t)lo->n_units)
        return errf(err, "model image: %u units, the model has %d", le_get_u32(p + 16), lo->n_units);
    size_t need = model_image_bytes_q(lo, dt, q);
    if (le_get_u64(p + 24) != need || len < need)
        return errf(err, "model image: %zu bytes, the model needs %zu", len, need);
    for (int u = 0; u < lo->n_units; u++)
        if (le_get_u64(p + IMAGE_FIXED + 16 * (size_t)u) != unit_offset(lo, dt, q, u) ||
            le_get_u64(p + IMAGE_FIXED + 16 * (size_t)u + 8) != lo->units[u].numel)
            return errf(err, "model image: unit %d does not match the model's layout", u);
    return 0;
}

void model_image_read_f32(const void *image, const llama_layout *lo, int unit, size_t first,
                          size_t n, float *dst) {
    model_image_dtype dt = model_image_dtype_of(image);
    const unsigned char *data = model_image_unit(image, lo, unit);
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

/* ---- NF4 images ---- */

typedef struct nf4_fill {
    unsigned char *image;
    const llama_layout *lo;
    model_image_dtype dt;
    model_image_quant q;
    model_image_nf4_layer nl;
    const st_model *st; /* NULL: random */
    int bnb;
    uint64_t seed;
    uint64_t max_blocks; /* of the largest linear */
    atomic_int next, failed;
    atomic_size_t done;
    size_t total;
    pthread_mutex_t lock; /* guards err */
    errbuf *err;
} nf4_fill;

/* A thread's buffers, and the progress callback (the calling thread's only). */
typedef struct nf4_worker {
    nf4_fill *f;
    float *values; /* IMAGE_CHUNK values of a tensor */
    float *absmax; /* double quantization: the fp32 absmax of the linear being quantized */
    model_image_progress progress;
    void *arg;
} nf4_worker;

/* n more values of the model are in the image (reported as the unquantized model's bytes). */
static void nf4_done(nf4_worker *w, size_t n) {
    size_t bytes = n * elem_bytes(w->f->dt);
    size_t done = atomic_fetch_add(&w->f->done, bytes) + bytes;
    if (w->progress) w->progress(w->arg, done, w->f->total);
}

/* Tensor i's values [first, first + n) as fp32, from the checkpoint or drawn. */
static int read_values(const nf4_fill *f, int i, size_t first, size_t n, float *dst, errbuf *err) {
    return f->st ? fill_from_checkpoint(f->lo, i, first, n, dst, f->st, err)
                 : fill_random(f->lo, i, first, n, dst, &f->seed, err);
}

/* Linear k (tensor i) of a layer unit copied as a bitsandbytes model stores it. */
static int copy_bnb_linear(nf4_worker *w, int i, int k, unsigned char *unit, errbuf *err) {
    const nf4_fill *f = w->f;
    const llama_tensor_slot *s = &f->lo->tensors[i];
    const model_image_nf4_layer *nl = &f->nl;
    int dq = f->q == MODEL_IMAGE_NF4_DQ;
    nf4_tensor t;
    int rc = nf4_read_bnb_tensor(f->st, s->name, &t, NULL, err);
    if (rc == 0 && (t.numel != s->numel || t.double_quant != dq))
        rc = errf(err, "%s: %llu values, %s quantization; the model needs %zu, %s", s->name,
                  (unsigned long long)t.numel, t.double_quant ? "double" : "single", s->numel,
                  dq ? "double" : "single");
    if (rc == 0) {
        memcpy(unit + nl->packed + nl->t_packed[k], t.packed, nf4_packed_bytes(t.numel));
        if (dq) {
            memcpy(unit + nl->absmax + nl->t_block[k], t.absmax_q, t.n_blocks);
            memcpy(unit + nl->nested + nl->t_nested[k] * sizeof(float), t.nested_absmax, t.n_nested * sizeof(float));
            memcpy(unit + nl->offsets + (size_t)k * sizeof(float), &t.offset, sizeof(float));
        } else {
            memcpy(unit + nl->absmax + nl->t_block[k] * sizeof(float), t.absmax, t.n_blocks * sizeof(float));
        }
        nf4_done(w, s->numel);
    }
    nf4_free(&t);
    return rc;
}

/* Linear k (tensor i) of a layer unit quantized from its values as the image's dtype holds
 * them, IMAGE_CHUNK values (whole blocks) at a time, the codes straight into the image; single
 * quantization's absmax too, double quantization's once the linear's every block is known. */
static int quantize_linear(nf4_worker *w, int i, int k, unsigned char *unit, errbuf *err) {
    const nf4_fill *f = w->f;
    const llama_tensor_slot *s = &f->lo->tensors[i];
    const model_image_nf4_layer *nl = &f->nl;
    int dq = f->q == MODEL_IMAGE_NF4_DQ;
    st_dtype dtype = f->dt == MODEL_IMAGE_BF16 ? ST_BF16 : ST_F32;
    uint8_t *packed = unit + nl->packed + nl->t_packed[k];
    float *absmax = dq ? w->absmax : (float *)(unit + nl->absmax + nl->t_block[k] * sizeof(float));
    for (size_t first = 0; first < s->numel; first += IMAGE_CHUNK) {
        size_t n = s->numel - first < IMAGE_CHUNK ? s->numel - first : IMAGE_CHUNK;
        if (read_values(f, i, first, n, w->values, err)) return -1;
        for (size_t e = 0; e < n; e++) w->values[e] = nf4_round_to(dtype, w->values[e]);
        if (nf4_quantize_chunk(w->values, first, n, packed, absmax, err)) return -1;
        nf4_done(w, n);
    }
    if (dq)
        nf4_double_quantize(absmax, nf4_blocks(s->numel), unit + nl->absmax + nl->t_block[k],
                            (float *)(unit + nl->nested + nl->t_nested[k] * sizeof(float)),
                            (float *)(unit + nl->offsets + (size_t)k * sizeof(float)));
    return 0;
}

static int fill_linear(nf4_worker *w, int i, int k, unsigned char *unit, errbuf *err) {
    int rc = w->f->bnb ? copy_bnb_linear(w, i, k, unit, err) : quantize_linear(w, i, k, unit, err);
    return rc ? errprefix(err, "quantizing %s", w->f->lo->tensors[i].name) : 0;
}

/* A tensor kept in dtype: at its place in a plain unit, or in a layer unit's norms. */
static int fill_plain(nf4_worker *w, int i, unsigned char *unit, errbuf *err) {
    const nf4_fill *f = w->f;
    const llama_tensor_slot *s = &f->lo->tensors[i];
    size_t at = s->offset; /* elements from the unit data's start */
    if (is_layer(f->lo, s->unit))
        at = s->offset - f->lo->tensors[f->lo->units[s->unit].first + MODEL_IMAGE_LINEARS].offset;
    for (size_t first = 0; first < s->numel; first += IMAGE_CHUNK) {
        size_t n = s->numel - first < IMAGE_CHUNK ? s->numel - first : IMAGE_CHUNK;
        if (read_values(f, i, first, n, w->values, err)) return -1;
        store(unit, f->dt, at + first, w->values, n);
        nf4_done(w, n);
    }
    return 0;
}

/* Takes tensors until none is left. */
static void nf4_fill_tensors(nf4_fill *f, model_image_progress progress, void *arg) {
    nf4_worker w = {.f = f, .progress = progress, .arg = arg};
    int need_absmax = f->q == MODEL_IMAGE_NF4_DQ && !f->bnb;
    w.values = malloc(IMAGE_CHUNK * sizeof *w.values);
    w.absmax = need_absmax ? malloc(f->max_blocks * sizeof *w.absmax) : NULL;
    errbuf err;
    int rc = w.values && (w.absmax || !need_absmax) ? 0 : errf(&err, "model image: out of memory");
    for (int i; rc == 0 && !atomic_load(&f->failed) && (i = atomic_fetch_add(&f->next, 1)) < f->lo->n_tensors;) {
        const llama_tensor_slot *s = &f->lo->tensors[i];
        unsigned char *unit = f->image + unit_offset(f->lo, f->dt, f->q, s->unit);
        int k = i - f->lo->units[s->unit].first;
        rc = is_layer(f->lo, s->unit) && k < MODEL_IMAGE_LINEARS ? fill_linear(&w, i, k, unit, &err)
                                                                 : fill_plain(&w, i, unit, &err);
    }
    if (rc) {
        pthread_mutex_lock(&f->lock);
        if (!atomic_exchange(&f->failed, 1) && f->err) *f->err = err;
        pthread_mutex_unlock(&f->lock);
    }
    free(w.values);
    free(w.absmax);
}

static void *nf4_fill_thread(void *arg) {
    nf4_fill_tensors(arg, NULL, NULL);
    return NULL;
}

int model_image_fill_nf4(void *image, const llama_layout *lo, model_image_dtype dt,
                         model_image_quant q, const st_model *st, int bnb, uint64_t seed,
                         model_image_progress progress, void *arg, errbuf *err) {
    if (q == MODEL_IMAGE_PLAIN) return errf(err, "model image: NF4 fill of a plain image");
    if (bnb && !st) return errf(err, "model image: a bitsandbytes model needs its files");
    nf4_fill f = {.image = image, .lo = lo, .dt = dt, .q = q, .st = st, .bnb = bnb, .seed = seed,
                  .lock = PTHREAD_MUTEX_INITIALIZER, .err = err};
    model_image_nf4_layer_of(lo, dt, q, &f.nl);
    for (int k = 0; k < MODEL_IMAGE_LINEARS; k++)
        if (nf4_blocks(f.nl.t_numel[k]) > f.max_blocks) f.max_blocks = nf4_blocks(f.nl.t_numel[k]);
    for (int u = 0; u < lo->n_units; u++) f.total += lo->units[u].numel * elem_bytes(dt);
    write_header(image, lo, dt, q);
    int n_threads = model_image_fill_threads() - 1; /* besides the calling thread */
    if (n_threads > lo->n_tensors) n_threads = lo->n_tensors;
    pthread_t threads[IMAGE_MAX_THREADS];
    int started = 0;
    while (started < n_threads && pthread_create(&threads[started], NULL, nf4_fill_thread, &f) == 0) started++;
    nf4_fill_tensors(&f, progress, arg); /* fewer threads than asked for only makes it slower */
    for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
    if (atomic_load(&f.failed)) return -1;
    if (progress) progress(arg, f.total, f.total); /* the end, whoever filled it */
    return 0;
}
