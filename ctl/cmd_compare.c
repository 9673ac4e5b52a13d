/* fsdpctl compare: tensor by tensor relative error ||a-b|| / ||b|| between two safetensors
 * files (or model directories), B being the reference.  Prints one line per tensor and
 * exits 1 when a tensor is missing on either side, shapes differ, or an error exceeds the
 * tolerance.  With --prefix P, A's tensor N is B's tensor P+N, and B's tensors without
 * the prefix are not compared (the golden files keep several sets side by side:
 * param.*, grad.*); --total-rtol R also bounds the error over all compared tensors
 * together, as one vector.  --subset: B may hold tensors A has not (they are not compared);
 * --peft-default: B's adapter names carry PEFT's in-memory ".default" (lora_A.default.weight
 * for A's lora_A.weight), as PEFT's golden outputs do. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/bf16.h"
#include "ctl/fsdpctl.h"
#include "proto/safetensors.h"

static const char compare_usage[] =
    "usage: fsdpctl compare A.safetensors B.safetensors [--rtol R] [--prefix P] [--total-rtol R]\n"
    "       [--subset] [--peft-default]\n"
    "  (A and B may also be model directories; default rtol 1e-4, no total bound)\n";

/* A file or a model directory, seen as one list of tensors. */
typedef struct source {
    int is_dir;
    st_file file;
    st_model model;
} source;

static int source_open(source *s, const char *path, errbuf *err) {
    struct stat sb;
    if (stat(path, &sb)) return errf(err, "%s: %s", path, strerror(errno));
    s->is_dir = S_ISDIR(sb.st_mode);
    return s->is_dir ? st_model_open(&s->model, path, err) : st_open(&s->file, path, err);
}

static void source_close(source *s) {
    if (s->is_dir) st_model_close(&s->model);
    else st_close(&s->file);
}

static int source_count(const source *s) {
    return s->is_dir ? s->model.n_tensors : s->file.n_tensors;
}

static const st_tensor *source_tensor(const source *s, int i) {
    return s->is_dir ? s->model.tensors[i] : &s->file.tensors[i];
}

static const st_tensor *source_find(const source *s, const char *name) {
    return s->is_dir ? st_model_find(&s->model, name) : st_find(&s->file, name);
}

/* Element i of a tensor of any dtype, as a double (data may be unaligned). */
static double element(const st_tensor *t, uint64_t i) {
    const unsigned char *p = (const unsigned char *)t->data + i * st_dtype_size(t->dtype);
    union {
        double f64;
        float f32;
        uint16_t u16;
        int64_t i64;
        int32_t i32;
        int16_t i16;
        int8_t i8;
        uint8_t u8;
    } v;
    memcpy(&v, p, st_dtype_size(t->dtype));
    switch (t->dtype) {
    case ST_F64: return v.f64;
    case ST_F32: return v.f32;
    case ST_F16: return f16_to_f32(v.u16);
    case ST_BF16: return bf16_to_f32(v.u16);
    case ST_I64: return (double)v.i64;
    case ST_I32: return v.i32;
    case ST_I16: return v.i16;
    case ST_I8: return v.i8;
    case ST_U8:
    case ST_BOOL: return v.u8;
    default: return NAN;
    }
}

static void format_shape(const st_tensor *t, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", d ? ", " : "",
                               (long long)t->shape[d]);
    if (at < len) snprintf(buf + at, len - at, "]");
}

static int same_shape(const st_tensor *a, const st_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

/* Sums of squares of a-b and of b. */
typedef struct error_sums {
    double diff, ref;
} error_sums;

static error_sums error_of(const st_tensor *a, const st_tensor *b) {
    error_sums e = {0.0, 0.0};
    for (uint64_t i = 0; i < a->numel; i++) {
        double x = element(a, i), y = element(b, i);
        e.diff += (x - y) * (x - y);
        e.ref += y * y;
    }
    return e;
}

/* ||a-b|| / ||b||, or ||a-b|| when b is all zeros (then *absolute is set). */
static double relative_error(error_sums e, int *absolute) {
    *absolute = e.ref == 0.0;
    return *absolute ? sqrt(e.diff) : sqrt(e.diff / e.ref);
}

typedef struct compare_options {
    double rtol, total_rtol; /* total_rtol < 0: no bound */
    const char *prefix;      /* "" for none */
    int subset, peft_default;
} compare_options;

/* B's name of A's tensor `name`: the prefix, and with peft_default ".default" before an
 * adapter's ".weight". */
static void name_in_b(const compare_options *o, const char *name, char *out, size_t n) {
    const char *lora = o->peft_default ? strstr(name, ".lora_") : NULL;
    const char *dot = lora ? strchr(lora + 1, '.') : NULL;
    if (dot && !strcmp(dot, ".weight"))
        snprintf(out, n, "%s%.*s.default.weight", o->prefix, (int)(dot - name), name);
    else
        snprintf(out, n, "%s%s", o->prefix, name);
}

/* Prints the comparison; *problems counts missing tensors, shape mismatches and errors over
 * rtol. */
static int compare(const char *path_a, const char *path_b, const compare_options *o,
                   int *problems_out, errbuf *err) {
    source a = {0}, b = {0};
    if (source_open(&a, path_a, err)) return -1;
    if (source_open(&b, path_b, err)) {
        source_close(&a);
        return -1;
    }
    int problems = 0, n_compared = 0;
    double worst = 0.0, rtol = o->rtol;
    const char *worst_name = "";
    size_t plen = strlen(o->prefix);
    error_sums total = {0.0, 0.0};
    for (int i = 0; i < source_count(&a); i++) {
        const st_tensor *ta = source_tensor(&a, i);
        char name_b[ST_MAX_NAME + 64];
        name_in_b(o, ta->name, name_b, sizeof name_b);
        const st_tensor *tb = source_find(&b, name_b);
        char sa[96], sb[96];
        format_shape(ta, sa, sizeof sa);
        if (!tb) {
            printf("%-56s %s only in %s\n", ta->name, sa, path_a);
            problems++;
            continue;
        }
        format_shape(tb, sb, sizeof sb);
        if (!same_shape(ta, tb)) {
            printf("%-56s shape %s vs %s\n", ta->name, sa, sb);
            problems++;
            continue;
        }
        int absolute;
        error_sums sums = error_of(ta, tb);
        double e = relative_error(sums, &absolute);
        total.diff += sums.diff;
        total.ref += sums.ref;
        int bad = !(e <= rtol); /* NaN is bad */
        printf("%-56s %-16s %s%s %.3e%s\n", ta->name, sa,
               absolute ? "abs" : "rel",
               ta->dtype == tb->dtype ? "" : " (dtypes differ)", e, bad ? "  > rtol" : "");
        problems += bad;
        n_compared++;
        if (!(e <= worst)) {
            worst = e;
            worst_name = ta->name;
        }
    }
    for (int i = 0; !o->subset && i < source_count(&b); i++) {
        const st_tensor *tb = source_tensor(&b, i);
        if (strncmp(tb->name, o->prefix, plen) != 0) continue;
        char name_a[ST_MAX_NAME];
        snprintf(name_a, sizeof name_a, "%s", tb->name + plen);
        char *def = o->peft_default ? strstr(name_a, ".default.weight") : NULL;
        if (def) memmove(def, def + 8, strlen(def + 8) + 1); /* drop ".default" */
        if (!source_find(&a, name_a)) {
            printf("%-56s only in %s\n", tb->name, path_b);
            problems++;
        }
    }
    int absolute;
    double e_total = relative_error(total, &absolute);
    if (o->total_rtol >= 0) {
        int bad = !(e_total <= o->total_rtol);
        printf("all tensors together: %s %.3e, total rtol %.1e%s\n", absolute ? "abs" : "rel",
               e_total, o->total_rtol, bad ? "  > total rtol" : "");
        problems += bad;
    }
    printf("%d tensors compared, worst error %.3e (%s), rtol %.1e: %d problem%s\n", n_compared,
           worst, worst_name, rtol, problems, problems == 1 ? "" : "s");
    source_close(&a);
    source_close(&b);
    *problems_out = problems;
    return 0;
}

int cmd_compare(int argc, char **argv) {
    const char *paths[2];
    int n_paths = 0;
    compare_options o = {.rtol = 1e-4, .total_rtol = -1, .prefix = ""};
    for (int i = 1; i < argc; i++) {
        int is_rtol = !strcmp(argv[i], "--rtol"), is_total = !strcmp(argv[i], "--total-rtol");
        if ((is_rtol || is_total) && i + 1 < argc) {
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(v >= 0)) {
                fprintf(stderr, "fsdpctl compare: bad %s '%s'\n%s", argv[i - 1], argv[i],
                        compare_usage);
                return 2;
            }
            *(is_rtol ? &o.rtol : &o.total_rtol) = v;
        } else if (!strcmp(argv[i], "--prefix") && i + 1 < argc) {
            o.prefix = argv[++i];
        } else if (!strcmp(argv[i], "--subset")) {
            o.subset = 1;
        } else if (!strcmp(argv[i], "--peft-default")) {
            o.peft_default = 1;
        } else if (argv[i][0] != '-' && n_paths < 2) {
            paths[n_paths++] = argv[i];
        } else {
            fprintf(stderr, "fsdpctl compare: unexpected argument '%s'\n%s", argv[i],
                    compare_usage);
            return 2;
        }
    }
    if (n_paths != 2) {
        fputs(compare_usage, stderr);
        return 2;
    }
    errbuf err = {{0}};
    int problems;
    if (compare(paths[0], paths[1], &o, &problems, &err)) {
        fprintf(stderr, "fsdpctl compare: %s\n", err.msg);
        return 1;
    }
    return problems ? 1 : 0;
}
