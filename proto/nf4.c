/* nf4: bitsandbytes-compatible NF4 quantization (see nf4.h for the rules). */
#include "proto/nf4.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/bf16.h"

/* The values are base/nf4_tables.h's, which the kernels share. */
const float nf4_code[16] = NF4_CODE_VALUES;

/* dQuantizeNF4's decision tree flattened: its 15 thresholds (fp32 literals) in increasing
 * order; the tree returns the number of thresholds x is above (every test is `x > t`, so a
 * value equal to a threshold takes the lower code, and NaN, above none, codes 0). */
static const float nf4_thresholds[15] = {
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
    0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f,
};

const float nf4_dynamic_map[256] = NF4_DYNAMIC_MAP_VALUES;

uint64_t nf4_packed_bytes(uint64_t numel) { return (numel + 1) / 2; }
uint64_t nf4_blocks(uint64_t numel) { return (numel + NF4_BLOCK - 1) / NF4_BLOCK; }
static uint64_t nested_blocks(uint64_t n_blocks) { return (n_blocks + NF4_NESTED_BLOCK - 1) / NF4_NESTED_BLOCK; }

float nf4_round_to(st_dtype dtype, float x) {
    if (dtype == ST_BF16) return bf16_to_f32(bf16_from_f32(x));
    if (dtype == ST_F16) return f16_to_f32(f16_from_f32(x));
    return x;
}

static uint8_t nf4_encode(float x) {
    uint8_t c = 0;
    for (int i = 0; i < 15; i++) c += x > nf4_thresholds[i];
    return c;
}

/* max |v| of a block, as bnb's fmaxf reduction (its padding is 0.0, which never wins). */
static float block_absmax(const float *v, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(v[i]));
    return m;
}

/* bnb's dQuantize<0> (csrc/kernels.cu): a binary search of the sorted map from its middle,
 * then the nearer of the two neighbours by fp32 midpoints. */
static uint8_t dynamic_encode(const float *code, float x) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f, val = code[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = code[pivot];
    }
    if (upper_pivot == 255) upper = code[upper_pivot];
    if (lower_pivot == 0) lower = code[lower_pivot];
    if (x > val) return (uint8_t)(x > (upper + val) * 0.5f ? upper_pivot : pivot);
    return (uint8_t)(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

int nf4_quantize_chunk(const float *w, uint64_t first, uint64_t n, uint8_t *packed, float *absmax,
                       errbuf *err) {
    if (first % NF4_BLOCK) return errf(err, "NF4: a chunk at element %llu does not start a block", (unsigned long long)first);
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(w[i])) return errf(err, "NF4: element %llu is not finite", (unsigned long long)(first + i));
    packed += first / 2;
    absmax += first / NF4_BLOCK;
    memset(packed, 0, nf4_packed_bytes(n));
    for (uint64_t b = 0; b * NF4_BLOCK < n; b++) {
        uint64_t start = b * NF4_BLOCK, len = n - start < NF4_BLOCK ? n - start : NF4_BLOCK;
        absmax[b] = block_absmax(w + start, len);
        float scale = 1.0f / absmax[b]; /* inf for an all-zero block: every product is NaN */
        for (uint64_t i = start; i < start + len; i++) {
            uint8_t c = nf4_encode(w[i] * scale);
            packed[i / 2] |= (uint8_t)(i % 2 ? c : c << 4);
        }
    }
    if (n % 2) packed[n / 2] |= nf4_encode(0.0f); /* bnb's zero padding: 7 */
    return 0;
}

/* absmax.mean() as torch computes it on CUDA (aten/src/ATen/native/cuda/Reduce.cuh, one
 * block): over n > 128 values, loads of 4 (thread t takes vectors t, t + T, ...; one
 * accumulator per lane of the vector, the n % 4 tail to threads 0..), else strided loads
 * with 4 accumulators; T = the largest power of two <= the vector count, at most 512
 * threads; the 4 accumulators summed in order, a shared-memory tree down to one warp, a warp
 * tree with decreasing offsets, and the sum times the fp32 1/n.  Exact while torch uses one
 * thread block (up to about 2^19 values: 33 M weights); beyond, torch spreads the sum over
 * blocks as the GPU's size dictates, and this order stays within an ulp or two of it. */
#define MEAN_THREADS 512
static float torch_cuda_mean(const float *x, uint64_t n) {
    int vec = n > 128;
    uint64_t dim0 = vec ? n / 4 : n, T = 1;
    while (T * 2 <= dim0 && T * 2 <= MEAN_THREADS) T *= 2;
    float v[MEAN_THREADS];
    for (uint64_t t = 0; t < T; t++) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (vec) {
            for (uint64_t idx = t; idx * 4 + 3 < n; idx += T)
                for (int i = 0; i < 4; i++) acc[i] += x[idx * 4 + i];
            if (n - n % 4 + t < n) acc[0] += x[n - n % 4 + t];
        } else {
            uint64_t idx = t;
            for (; idx + 3 * T < n; idx += 4 * T)
                for (uint64_t i = 0; i < 4; i++) acc[i] += x[idx + i * T];
            for (int i = 0; i < 4 && idx < n; i++, idx += T) acc[i] += x[idx];
        }
        v[t] = ((acc[0] + acc[1]) + acc[2]) + acc[3];
    }
    uint64_t width = T;
    for (; width > 32; width /= 2) /* shared memory, offsets T/2 .. 32 */
        for (uint64_t t = 0; t < width / 2; t++) v[t] += v[t + width / 2];
    for (uint64_t off = width / 2; off > 0; off /= 2) /* __shfl_down, offsets 16 .. 1 */
        for (uint64_t t = 0; t < off; t++) v[t] += v[t + off];
    return v[0] * (1.0f / (float)n);
}

void nf4_double_quantize(const float *absmax, uint64_t nb, uint8_t *q, float *nested, float *offset) {
    *offset = torch_cuda_mean(absmax, nb);
    float centred[NF4_NESTED_BLOCK];
    for (uint64_t b = 0; b * NF4_NESTED_BLOCK < nb; b++) {
        uint64_t first = b * NF4_NESTED_BLOCK;
        size_t len = nb - first < NF4_NESTED_BLOCK ? (size_t)(nb - first) : NF4_NESTED_BLOCK;
        for (size_t i = 0; i < len; i++) centred[i] = absmax[first + i] - *offset;
        nested[b] = block_absmax(centred, len);
        float scale = 1.0f / nested[b];
        for (size_t i = 0; i < len; i++) q[first + i] = dynamic_encode(nf4_dynamic_map, centred[i] * scale);
    }
}

void nf4_free(nf4_tensor *t) {
    free(t->packed);
    free(t->absmax);
    free(t->absmax_q);
    free(t->nested_absmax);
    t->packed = t->absmax_q = NULL;
    t->absmax = t->nested_absmax = NULL;
}

static int check_float_dtype(st_dtype dtype, errbuf *err) {
    if (dtype == ST_F32 || dtype == ST_BF16 || dtype == ST_F16) return 0;
    return errf(err, "NF4 quantizes F32, BF16 or F16 tensors, not %s", st_dtype_name(dtype));
}

/* Fills t's description and allocates its arrays (absmax, or absmax_q + nested_absmax). */
static int nf4_alloc(nf4_tensor *t, st_dtype dtype, int ndim, const int64_t *shape, int double_quant,
                     errbuf *err) {
    memset(t, 0, sizeof *t);
    if (check_float_dtype(dtype, err)) return -1;
    if (ndim < 1 || ndim > ST_MAX_DIMS) return errf(err, "NF4: %d dims (1 to %d)", ndim, ST_MAX_DIMS);
    t->dtype = dtype;
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || (uint64_t)shape[d] > (UINT64_C(1) << 40) / t->numel)
            return errf(err, "NF4: dimension %d of size %lld", d, (long long)shape[d]);
        t->shape[d] = shape[d];
        t->numel *= (uint64_t)shape[d];
    }
    t->n_blocks = nf4_blocks(t->numel);
    t->double_quant = double_quant;
    t->packed = malloc(nf4_packed_bytes(t->numel));
    if (double_quant) {
        t->n_nested = nested_blocks(t->n_blocks);
        t->absmax_q = malloc(t->n_blocks);
        t->nested_absmax = malloc(t->n_nested * sizeof(float));
    } else {
        t->absmax = malloc(t->n_blocks * sizeof(float));
    }
    if (!t->packed || !(double_quant ? t->absmax_q && t->nested_absmax : t->absmax != NULL))
        return errf(err, "NF4: out of memory for %llu values", (unsigned long long)t->numel);
    return 0;
}

int nf4_quantize(const float *w, st_dtype dtype, int ndim, const int64_t *shape, int double_quant,
                 nf4_tensor *t, errbuf *err) {
    if (nf4_alloc(t, dtype, ndim, shape, double_quant, err)) return -1;
    float *absmax = double_quant ? malloc(t->n_blocks * sizeof(float)) : t->absmax;
    if (!absmax) return errf(err, "NF4: out of memory for %llu blocks", (unsigned long long)t->n_blocks);
    int rc = nf4_quantize_chunk(w, 0, t->numel, t->packed, absmax, err);
    if (rc == 0 && double_quant) nf4_double_quantize(absmax, t->n_blocks, t->absmax_q, t->nested_absmax, &t->offset);
    if (double_quant) free(absmax);
    return rc;
}

void nf4_block_absmax(const nf4_tensor *t, float *out) {
    for (uint64_t b = 0; b < t->n_blocks; b++) {
        if (!t->double_quant) {
            out[b] = t->absmax[b];
            continue;
        }
        /* two fp32 roundings, as bnb's dequantize_blockwise and then `absmax += offset` */
        float centred = nf4_dynamic_map[t->absmax_q[b]] * t->nested_absmax[b / NF4_NESTED_BLOCK];
        out[b] = centred + t->offset;
    }
}

int nf4_dequantize(const nf4_tensor *t, float *out, errbuf *err) {
    float *absmax = malloc(t->n_blocks * sizeof(float));
    if (!absmax) return errf(err, "NF4: out of memory for %llu blocks", (unsigned long long)t->n_blocks);
    nf4_block_absmax(t, absmax);
    for (uint64_t i = 0; i < t->numel; i++) {
        uint8_t byte = t->packed[i / 2], c = i % 2 ? byte & 15 : byte >> 4;
        out[i] = nf4_round_to(t->dtype, nf4_code[c] * absmax[i / NF4_BLOCK]);
    }
    free(absmax);
    return 0;
}

/* ---- the quant_state JSON ---- */

static const struct {
    st_dtype dtype;
    const char *torch; /* str(torch.float32).strip("torch.") */
} torch_dtypes[] = {{ST_F32, "float32"}, {ST_BF16, "bfloat16"}, {ST_F16, "float16"}};
#define N_TORCH_DTYPES (sizeof torch_dtypes / sizeof torch_dtypes[0])

static const char *torch_dtype_name(st_dtype d) {
    for (size_t i = 0; i < N_TORCH_DTYPES; i++)
        if (torch_dtypes[i].dtype == d) return torch_dtypes[i].torch;
    return NULL;
}

static const char *const state_keys[] = {"quant_type", "blocksize", "dtype", "shape",
                                         "nested_blocksize", "nested_dtype", "nested_offset"};
#define N_STATE_KEYS 7
#define N_PLAIN_KEYS 4 /* the first four; the nested three come together */

static int state_int(const json_t *o, const char *key, json_int_t want, errbuf *err) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return errf(err, "quant_state: %s is not an integer", key);
    if (json_integer_value(v) != want)
        return errf(err, "quant_state: %s %lld: only %lld is supported", key, (long long)json_integer_value(v),
                    (long long)want);
    return 0;
}

static int state_dtype(const json_t *o, const char *key, int fp32_only, st_dtype *out, errbuf *err) {
    const char *s = json_string_value(json_object_get(o, key));
    if (!s) return errf(err, "quant_state: %s is not a string", key);
    for (size_t i = 0; i < (fp32_only ? 1 : N_TORCH_DTYPES); i++)
        if (!strcmp(s, torch_dtypes[i].torch)) {
            *out = torch_dtypes[i].dtype;
            return 0;
        }
    return errf(err, "quant_state: %s \"%.40s\": expected %s", key, s,
                fp32_only ? "float32" : "float32, bfloat16 or float16");
}

static int state_shape(const json_t *o, nf4_quant_state *s, errbuf *err) {
    const json_t *a = json_object_get(o, "shape");
    if (!json_is_array(a)) return errf(err, "quant_state: shape is not an array");
    size_t n = json_array_size(a);
    if (n < 1 || n > ST_MAX_DIMS) return errf(err, "quant_state: shape has %zu dims (1 to %d)", n, ST_MAX_DIMS);
    uint64_t numel = 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *d = json_array_get(a, i);
        if (!json_is_integer(d)) return errf(err, "quant_state: shape[%zu] is not an integer", i);
        json_int_t v = json_integer_value(d);
        if (v < 1 || (uint64_t)v > (UINT64_C(1) << 40) / numel)
            return errf(err, "quant_state: shape[%zu] %lld out of range", i, (long long)v);
        numel *= (uint64_t)v;
        s->shape[i] = v;
    }
    s->ndim = (int)n;
    return 0;
}

static int state_keys_check(const json_t *o, int *nested, errbuf *err) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        int known = 0;
        for (int i = 0; i < N_STATE_KEYS; i++) known |= !strcmp(key, state_keys[i]);
        if (!known) return errf(err, "quant_state: unknown field \"%.64s\"", key);
    }
    for (int i = 0; i < N_PLAIN_KEYS; i++)
        if (!json_object_get(o, state_keys[i])) return errf(err, "quant_state: %s is missing", state_keys[i]);
    int n_nested = 0;
    for (int i = N_PLAIN_KEYS; i < N_STATE_KEYS; i++) n_nested += json_object_get(o, state_keys[i]) != NULL;
    for (int i = N_PLAIN_KEYS; n_nested && i < N_STATE_KEYS; i++)
        if (!json_object_get(o, state_keys[i]))
            return errf(err, "quant_state: %s is missing (the nested fields come together)", state_keys[i]);
    *nested = n_nested > 0;
    return 0;
}

static int state_from_json(const json_t *o, nf4_quant_state *s, errbuf *err) {
    if (!json_is_object(o)) return errf(err, "quant_state: not a JSON object");
    if (state_keys_check(o, &s->nested, err)) return -1;
    const char *qt = json_string_value(json_object_get(o, "quant_type"));
    if (!qt) return errf(err, "quant_state: quant_type is not a string");
    if (strcmp(qt, "nf4")) return errf(err, "quant_state: quant_type \"%.40s\": only nf4 is supported", qt);
    if (state_int(o, "blocksize", NF4_BLOCK, err) || state_dtype(o, "dtype", 0, &s->dtype, err) ||
        state_shape(o, s, err))
        return -1;
    if (!s->nested) return 0;
    st_dtype nested_dtype;
    if (state_int(o, "nested_blocksize", NF4_NESTED_BLOCK, err) ||
        state_dtype(o, "nested_dtype", 1, &nested_dtype, err))
        return -1;
    const json_t *off = json_object_get(o, "nested_offset");
    if (!json_is_number(off)) return errf(err, "quant_state: nested_offset is not a number");
    s->nested_offset = json_number_value(off);
    if (!isfinite(s->nested_offset) || !isfinite((float)s->nested_offset))
        return errf(err, "quant_state: nested_offset %g is not a finite fp32 value", s->nested_offset);
    return 0;
}

int nf4_state_parse(const void *buf, size_t len, nf4_quant_state *s, errbuf *err) {
    memset(s, 0, sizeof *s);
    if (len > NF4_STATE_MAX) return errf(err, "quant_state: %zu bytes (at most %d)", len, NF4_STATE_MAX);
    json_error_t je;
    json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return errf(err, "quant_state: invalid JSON: %s (at byte %d)", je.text, je.position);
    int rc = state_from_json(o, s, err);
    json_decref(o);
    return rc;
}

/* x as Python's repr(float) writes it: the shortest digits that read back as x, fixed
 * notation (at least one digit after the point) for 1e-4 <= |x| < 1e16, else d.ddde+XX. */
static void python_float_repr(double x, char *out, size_t n) {
    char e[40];
    int digits = 1;
    for (; digits < 17; digits++) {
        snprintf(e, sizeof e, "%.*e", digits - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    snprintf(e, sizeof e, "%.*e", digits - 1, x); /* [-]d.ddde[+-]XX */
    const char *p = e + (e[0] == '-');
    char mant[24];
    int m = 0;
    for (; *p && *p != 'e'; p++)
        if (isdigit((unsigned char)*p)) mant[m++] = *p;
    mant[m] = 0;
    int exp10 = atoi(p + 1), decpt = exp10 + 1; /* x = 0.mant * 10^decpt */
    char buf[64], *q = buf;
    if (e[0] == '-') *q++ = '-';
    if (decpt <= -4 || decpt > 16) {
        snprintf(q, sizeof buf - 2, "%c%s%se%c%02d", mant[0], m > 1 ? "." : "", mant + 1,
                 exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (decpt <= 0) { /* 0.000ddd */
        q += sprintf(q, "0.");
        for (int i = 0; i < -decpt; i++) *q++ = '0';
        strcpy(q, mant);
    } else { /* ddd.ddd, ddd000.0 */
        for (int i = 0; i < decpt; i++) *q++ = i < m ? mant[i] : '0';
        *q++ = '.';
        strcpy(q, decpt < m ? mant + decpt : "0");
    }
    snprintf(out, n, "%s", buf);
}

#define STATE_FORMAT "{\"quant_type\": \"nf4\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": %s%s}"

char *nf4_state_format(const nf4_quant_state *s, size_t *len) {
    char shape[ST_MAX_DIMS * 24 + 4] = "[", *p = shape + 1;
    for (int d = 0; d < s->ndim; d++)
        p += sprintf(p, "%s%lld", d ? ", " : "", (long long)s->shape[d]);
    strcpy(p, "]");
    char nested[224] = "", off[64];
    if (s->nested) {
        python_float_repr(s->nested_offset, off, sizeof off);
        snprintf(nested, sizeof nested,
                 ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %s",
                 NF4_NESTED_BLOCK, off);
    }
    const char *dtype = torch_dtype_name(s->dtype);
    int n = snprintf(NULL, 0, STATE_FORMAT, NF4_BLOCK, dtype ? dtype : "?", shape, nested);
    char *out = malloc((size_t)n + 1);
    if (!out) return NULL;
    snprintf(out, (size_t)n + 1, STATE_FORMAT, NF4_BLOCK, dtype ? dtype : "?", shape, nested);
    *len = (size_t)n;
    return out;
}

void nf4_state_of(const nf4_tensor *t, nf4_quant_state *s) {
    memset(s, 0, sizeof *s);
    s->dtype = t->dtype;
    s->ndim = t->ndim;
    memcpy(s->shape, t->shape, sizeof s->shape);
    s->nested = t->double_quant;
    s->nested_offset = t->offset;
}

/* ---- the bnb-4bit layout ---- */

/* base + suffix's tensor, which must be of dtype and [d0] (d1 < 0) or [d0, d1]. */
static const st_tensor *companion(const st_model *m, const char *base, const char *suffix, st_dtype dtype,
                                  int64_t d0, int64_t d1, errbuf *err) {
    char name[ST_MAX_NAME];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    const st_tensor *t = st_model_find(m, name);
    if (!t) return errf(err, "%s is missing", name), NULL;
    int ndim = d1 < 0 ? 1 : 2;
    if (t->dtype != dtype || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        char want[48];
        snprintf(want, sizeof want, d1 < 0 ? "[%lld]" : "[%lld, %lld]", (long long)d0, (long long)d1);
        errf(err, "%s: expected %s %s", name, st_dtype_name(dtype), want);
        return NULL;
    }
    return t;
}

/* A code table stored with the weight must be bnb's own: it is not read, ours is used. */
static int check_table(const st_tensor *t, const float *want, size_t n, errbuf *err) {
    if (memcmp(t->data, want, n * sizeof(float)))
        return errf(err, "%s differs from bitsandbytes' %s", t->name, n == 16 ? "NF4 code" : "dynamic map");
    return 0;
}

static int read_state(const st_model *m, const char *base, nf4_quant_state *s, errbuf *err) {
    char name[ST_MAX_NAME];
    snprintf(name, sizeof name, "%s%s", base, NF4_STATE_SUFFIX);
    const st_tensor *t = st_model_find(m, name);
    if (!t) {
        snprintf(name, sizeof name, "%s.quant_state.bitsandbytes__fp4", base);
        if (st_model_find(m, name)) return errf(err, "%s: fp4 quantization is not supported (nf4 only)", base);
        return errf(err, "%s%s is missing", base, NF4_STATE_SUFFIX);
    }
    if (t->dtype != ST_U8 || t->ndim != 1) return errf(err, "%s: expected a U8 vector of JSON bytes", name);
    if (nf4_state_parse(t->data, t->nbytes, s, err)) return errprefix(err, "%s", name);
    return 0;
}

/* Copies the stored arrays into t (laid out by nf4_alloc from the state). */
static int read_arrays(const st_model *m, const char *base, nf4_tensor *t, errbuf *err) {
    const st_tensor *w = companion(m, base, "", ST_U8, (int64_t)nf4_packed_bytes(t->numel), 1, err);
    const st_tensor *a = w ? companion(m, base, ".absmax", t->double_quant ? ST_U8 : ST_F32,
                                       (int64_t)t->n_blocks, -1, err) : NULL;
    const st_tensor *qm = a ? companion(m, base, ".quant_map", ST_F32, 16, -1, err) : NULL;
    if (!qm || check_table(qm, nf4_code, 16, err)) return -1;
    memcpy(t->packed, w->data, w->nbytes);
    if (!t->double_quant) return st_read_f32(a, 0, t->n_blocks, t->absmax, err);
    const st_tensor *na = companion(m, base, ".nested_absmax", ST_F32, (int64_t)t->n_nested, -1, err);
    const st_tensor *nm = na ? companion(m, base, ".nested_quant_map", ST_F32, 256, -1, err) : NULL;
    if (!nm || check_table(nm, nf4_dynamic_map, 256, err)) return -1;
    memcpy(t->absmax_q, a->data, a->nbytes);
    return st_read_f32(na, 0, t->n_nested, t->nested_absmax, err);
}

int nf4_read_bnb_tensor(const st_model *m, const char *base, nf4_tensor *t, float **dq, errbuf *err) {
    nf4_quant_state s;
    memset(t, 0, sizeof *t);
    if (dq) *dq = NULL;
    if (read_state(m, base, &s, err)) return -1;
    if (nf4_alloc(t, s.dtype, s.ndim, s.shape, s.nested, err) || read_arrays(m, base, t, err))
        return errprefix(err, "%s", base);
    t->offset = (float)s.nested_offset; /* bnb: torch.tensor(float(nested_offset)), fp32 */
    if (!dq) return 0;
    *dq = malloc(t->numel * sizeof(float));
    if (!*dq) return errf(err, "%s: out of memory for %llu values", base, (unsigned long long)t->numel);
    return nf4_dequantize(t, *dq, err);
}

static void add_out(st_wtensor *out, int *n, char name_buf[NF4_MAX_OUT][ST_MAX_NAME], const char *base,
                    const char *suffix, st_dtype dtype, int64_t d0, int64_t d1, const void *data) {
    snprintf(name_buf[*n], ST_MAX_NAME, "%s%s", base, suffix);
    st_wtensor *w = &out[(*n)++];
    memset(w, 0, sizeof *w);
    w->name = name_buf[*n - 1];
    w->dtype = dtype;
    w->ndim = d1 < 0 ? 1 : 2;
    w->shape[0] = d0;
    w->shape[1] = d1;
    w->data = data;
}

int nf4_bnb_tensors(const char *base, const nf4_tensor *t, st_wtensor out[NF4_MAX_OUT],
                    char name_buf[NF4_MAX_OUT][ST_MAX_NAME], char **state, errbuf *err) {
    if (strlen(base) + strlen(NF4_STATE_SUFFIX) >= ST_MAX_NAME) return errf(err, "%s: name too long", base);
    nf4_quant_state s;
    nf4_state_of(t, &s);
    size_t len;
    if (!(*state = nf4_state_format(&s, &len))) return errf(err, "%s: out of memory", base);
    int n = 0, nb = (int)t->n_blocks;
    add_out(out, &n, name_buf, base, "", ST_U8, (int64_t)nf4_packed_bytes(t->numel), 1, t->packed);
    if (t->double_quant) add_out(out, &n, name_buf, base, ".absmax", ST_U8, nb, -1, t->absmax_q);
    else add_out(out, &n, name_buf, base, ".absmax", ST_F32, nb, -1, t->absmax);
    add_out(out, &n, name_buf, base, ".quant_map", ST_F32, 16, -1, nf4_code);
    if (t->double_quant) {
        add_out(out, &n, name_buf, base, ".nested_absmax", ST_F32, (int64_t)t->n_nested, -1, t->nested_absmax);
        add_out(out, &n, name_buf, base, ".nested_quant_map", ST_F32, 256, -1, nf4_dynamic_map);
    }
    add_out(out, &n, name_buf, base, NF4_STATE_SUFFIX, ST_U8, (int64_t)len, -1, *state);
    return n;
}

/* ---- config.json's quantization_config ---- */

static int qc_bool(const json_t *qc, const char *key, int want, errbuf *err) {
    const json_t *v = json_object_get(qc, key);
    if (!json_is_boolean(v)) return errf(err, "quantization_config.%s is %s", key, v ? "not a boolean" : "missing");
    if (want >= 0 && json_is_true(v) != want)
        return errf(err, "quantization_config.%s %s: only %s is supported", key, json_is_true(v) ? "true" : "false",
                    want ? "true (4-bit)" : "false");
    return json_is_true(v);
}

static int qc_string(const json_t *qc, const char *key, const char *want, errbuf *err) {
    const char *s = json_string_value(json_object_get(qc, key));
    if (!s) return errf(err, "quantization_config.%s is not a string", key);
    if (strcmp(s, want)) return errf(err, "quantization_config.%s \"%.40s\": only \"%s\" is supported", key, s, want);
    return 0;
}

int nf4_model_quant_parse(const json_t *config, nf4_model_quant *q, errbuf *err) {
    memset(q, 0, sizeof *q);
    const json_t *qc = json_object_get(config, "quantization_config");
    if (!qc) return 1;
    if (!json_is_object(qc)) return errf(err, "quantization_config is not an object");
    if (qc_string(qc, "quant_method", "bitsandbytes", err) || qc_bool(qc, "load_in_8bit", 0, err) < 0 ||
        qc_bool(qc, "load_in_4bit", 1, err) < 0 || qc_string(qc, "bnb_4bit_quant_type", "nf4", err) ||
        qc_string(qc, "bnb_4bit_quant_storage", "uint8", err))
        return -1;
    int dq = qc_bool(qc, "bnb_4bit_use_double_quant", -1, err);
    if (dq < 0) return -1;
    q->double_quant = dq;
    const char *cd = json_string_value(json_object_get(qc, "bnb_4bit_compute_dtype"));
    for (size_t i = 0; cd && i < N_TORCH_DTYPES; i++)
        if (!strcmp(cd, torch_dtypes[i].torch)) {
            q->compute_dtype = torch_dtypes[i].dtype;
            return 0;
        }
    return errf(err, "quantization_config.bnb_4bit_compute_dtype %s%.40s%s: expected float32, bfloat16 or float16",
                cd ? "\"" : "", cd ? cd : "(not a string)", cd ? "\"" : "");
}

json_t *nf4_model_quant_json(const nf4_model_quant *q) {
    const char *cd = torch_dtype_name(q->compute_dtype);
    return json_pack("{s:b,s:b,s:s,s:s,s:s,s:b,s:b,s:b,s:n,s:f,s:b,s:b,s:s}", "_load_in_4bit", 1, "_load_in_8bit", 0,
                     "bnb_4bit_compute_dtype", cd ? cd : "float32", "bnb_4bit_quant_storage", "uint8",
                     "bnb_4bit_quant_type", "nf4", "bnb_4bit_use_double_quant", q->double_quant,
                     "llm_int8_enable_fp32_cpu_offload", 0, "llm_int8_has_fp16_weight", 0, "llm_int8_skip_modules",
                     "llm_int8_threshold", 6.0, "load_in_4bit", 1, "load_in_8bit", 0, "quant_method", "bitsandbytes");
}

int nf4_round_trip(const float *w, int ndim, const int64_t *shape, float *out, errbuf *err) {
    nf4_tensor t;
    memset(&t, 0, sizeof t);
    int rc = nf4_quantize(w, ST_F32, ndim, shape, 1, &t, err);
    if (rc == 0) rc = nf4_dequantize(&t, out, err);
    nf4_free(&t);
    return rc;
}
