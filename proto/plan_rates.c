/* plan_rates: the rates table's strict decoder.  See plan_rates.h. */
#include "proto/plan_rates.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "proto/json_kind.h"

/* A full table of PLAN_RATES_MAX_ROWS rows in each list is well under 1 MiB. */
#define PLAN_RATES_MAX_BYTES (4u << 20)
#define COUNT(a) (sizeof (a) / sizeof (a)[0])

/* The scalar rates, each a finite positive number. */
static const struct number_key {
    const char *key;
    size_t offset;
} number_keys[] = {
    {"context_bytes", offsetof(plan_rates, context_bytes)},
    {"elementwise_gbps", offsetof(plan_rates, elementwise_gbps)},
    {"dequant_gbps", offsetof(plan_rates, dequant_gbps)},
    {"cross_entropy_gbps", offsetof(plan_rates, cross_entropy_gbps)},
    {"adamw_gbps", offsetof(plan_rates, adamw_gbps)},
    {"h2d_gbps", offsetof(plan_rates, h2d_gbps)},
    {"d2h_gbps", offsetof(plan_rates, d2h_gbps)},
    {"registered_h2d_gbps", offsetof(plan_rates, registered_h2d_gbps)},
    {"launch_us", offsetof(plan_rates, launch_us)},
    {"host_adamw_gelems", offsetof(plan_rates, host_adamw_gelems)},
    {"disk_gbps", offsetof(plan_rates, disk_gbps)},
};

/* The other keys; with number_keys, every key there is (all required). */
static const char *const other_keys[] = {"format", "gpu", "device", "gemm", "attention"};

/* The two tables' rows: n_dims shape dimensions (integers) then n_times times (numbers). */
typedef struct row_shape {
    const char *table, *columns;
    int n_dims, n_times;
} row_shape;

static const row_shape gemm_shape = {"gemm", "[N, I, O, fwd_ms, dx_ms, dw_ms]", 3, 3};
static const row_shape attention_shape = {"attention", "[B, T, Hq, Hkv, hd, fwd_ms, bwd_ms]", 5, 2};
#define ROW_MAX_VALUES 7

/* v as short JSON text for a message ("?" when it cannot be written). */
static void short_text(const json_t *v, char *out, size_t n) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(out, n, "%s", text ? text : "?");
    if (text && strlen(text) >= n && n > 4) memcpy(out + n - 4, "...", 4);
    free(text);
}

/* "got 2048.5" for a number, "got a string" for anything else. */
static void got_text(const json_t *v, char *out, size_t n) {
    char text[48];
    if (json_is_number(v)) short_text(v, text, sizeof text);
    snprintf(out, n, "got %s", json_is_number(v) ? text : json_kind(v));
}

static int check_keys(const json_t *root, const char *name, errbuf *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        int known = 0;
        for (size_t i = 0; i < COUNT(number_keys); i++) known |= !strcmp(key, number_keys[i].key);
        for (size_t i = 0; i < COUNT(other_keys); i++) known |= !strcmp(key, other_keys[i]);
        if (!known) return errf(err, "%s: unknown key \"%.64s\"", name, key);
    }
    for (size_t i = 0; i < COUNT(number_keys); i++)
        if (!json_object_get(root, number_keys[i].key))
            return errf(err, "%s: %s: missing", name, number_keys[i].key);
    for (size_t i = 0; i < COUNT(other_keys); i++)
        if (!json_object_get(root, other_keys[i]))
            return errf(err, "%s: %s: missing", name, other_keys[i]);
    return 0;
}

/* A finite positive number at `where` (a key, or "gemm[3][4]"). */
static int read_positive(const json_t *v, const char *where, double *out, const char *name,
                         errbuf *err) {
    double x = json_is_number(v) ? json_number_value(v) : 0;
    if (!(x > 0) || !isfinite(x)) {
        char got[64];
        got_text(v, got, sizeof got);
        return errf(err, "%s: %s: expected a finite positive number, %s", name, where, got);
    }
    *out = x;
    return 0;
}

/* A shape's dimension: an integer from 1 to INT_MAX. */
static int read_dim(const json_t *v, const char *where, int *out, const char *name, errbuf *err) {
    json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;
    if (n < 1 || n > INT_MAX) {
        char got[64];
        got_text(v, got, sizeof got);
        return errf(err, "%s: %s: expected a positive integer below 2^31, %s", name, where, got);
    }
    *out = (int)n;
    return 0;
}

/* A non-empty string shorter than PLAN_RATES_NAME_MAX, copied into out. */
static int read_name(const json_t *root, const char *key, char out[PLAN_RATES_NAME_MAX],
                     const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, key);
    if (!json_is_string(v))
        return errf(err, "%s: %s: expected a string, got %s", name, key, json_kind(v));
    size_t len = json_string_length(v);
    if (len == 0 || len >= PLAN_RATES_NAME_MAX)
        return errf(err, "%s: %s: %zu characters, expected 1 to %d", name, key, len,
                    PLAN_RATES_NAME_MAX - 1);
    memcpy(out, json_string_value(v), len + 1);
    return 0;
}

static int read_format(const json_t *root, const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, "format");
    if (json_is_string(v) && !strcmp(json_string_value(v), PLAN_RATES_FORMAT)) return 0;
    char text[80];
    short_text(v, text, sizeof text);
    return errf(err, "%s: format: %s, expected \"%s\"", name, text, PLAN_RATES_FORMAT);
}

static int read_numbers(const json_t *root, plan_rates *r, const char *name, errbuf *err) {
    for (size_t i = 0; i < COUNT(number_keys); i++) {
        double *out = (double *)((char *)r + number_keys[i].offset);
        if (read_positive(json_object_get(root, number_keys[i].key), number_keys[i].key, out, name,
                          err))
            return -1;
    }
    return 0;
}

/* The list of rows at s->table: its row count, or -1 when it is not 1..MAX_ROWS rows. */
static int table_rows(const json_t *root, const row_shape *s, const json_t **list,
                      const char *name, errbuf *err) {
    *list = json_object_get(root, s->table);
    if (!json_is_array(*list))
        return errf(err, "%s: %s: expected a list of rows %s, got %s", name, s->table, s->columns,
                    json_kind(*list));
    size_t n = json_array_size(*list);
    if (n < 1 || n > PLAN_RATES_MAX_ROWS)
        return errf(err, "%s: %s: %zu rows, expected 1 to %d", name, s->table, n,
                    PLAN_RATES_MAX_ROWS);
    return (int)n;
}

/* Row i of s->table into dims[s->n_dims] and times[s->n_times]. */
static int read_row(const json_t *row, const row_shape *s, size_t i, int *dims, double *times,
                    const char *name, errbuf *err) {
    size_t want = (size_t)(s->n_dims + s->n_times);
    if (!json_is_array(row))
        return errf(err, "%s: %s[%zu]: expected a list of %zu values %s, got %s", name, s->table,
                    i, want, s->columns, json_kind(row));
    if (json_array_size(row) != want)
        return errf(err, "%s: %s[%zu]: %zu values, expected %zu %s", name, s->table, i,
                    json_array_size(row), want, s->columns);
    char where[64];
    for (size_t c = 0; c < want; c++) {
        const json_t *v = json_array_get(row, c);
        snprintf(where, sizeof where, "%s[%zu][%zu]", s->table, i, c);
        int rc = (int)c < s->n_dims ? read_dim(v, where, &dims[c], name, err)
                                    : read_positive(v, where, &times[c - (size_t)s->n_dims], name, err);
        if (rc) return -1;
    }
    return 0;
}

static int read_gemm(const json_t *root, plan_rates *r, const char *name, errbuf *err) {
    const json_t *list;
    int n = table_rows(root, &gemm_shape, &list, name, err);
    if (n < 0) return -1;
    if (!(r->gemm = calloc((size_t)n, sizeof *r->gemm)))
        return errf(err, "%s: gemm: out of memory for %d rows", name, n);
    r->n_gemm = n;
    for (int i = 0; i < n; i++) {
        int d[ROW_MAX_VALUES];
        double t[ROW_MAX_VALUES];
        if (read_row(json_array_get(list, (size_t)i), &gemm_shape, (size_t)i, d, t, name, err))
            return -1;
        r->gemm[i] = (plan_gemm_rate){d[0], d[1], d[2], t[0], t[1], t[2]};
    }
    return 0;
}

static int read_attention(const json_t *root, plan_rates *r, const char *name, errbuf *err) {
    const json_t *list;
    int n = table_rows(root, &attention_shape, &list, name, err);
    if (n < 0) return -1;
    if (!(r->attention = calloc((size_t)n, sizeof *r->attention)))
        return errf(err, "%s: attention: out of memory for %d rows", name, n);
    r->n_attention = n;
    for (int i = 0; i < n; i++) {
        int d[ROW_MAX_VALUES];
        double t[ROW_MAX_VALUES];
        if (read_row(json_array_get(list, (size_t)i), &attention_shape, (size_t)i, d, t, name, err))
            return -1;
        if (d[2] % d[3])
            return errf(err, "%s: attention[%d]: Hq %d is not a multiple of Hkv %d", name, i, d[2],
                        d[3]);
        r->attention[i] = (plan_attention_rate){d[0], d[1], d[2], d[3], d[4], t[0], t[1]};
    }
    return 0;
}

static int read_table(const json_t *root, plan_rates *r, const char *name, errbuf *err) {
    if (!json_is_object(root)) return errf(err, "%s: %s, expected an object", name, json_kind(root));
    if (check_keys(root, name, err) || read_format(root, name, err) ||
        read_name(root, "gpu", r->gpu, name, err) || read_name(root, "device", r->device, name, err) ||
        read_numbers(root, r, name, err) || read_gemm(root, r, name, err) ||
        read_attention(root, r, name, err))
        return -1;
    return 0;
}

int plan_rates_parse(plan_rates *r, const char *text, size_t len, const char *name, errbuf *err) {
    memset(r, 0, sizeof *r);
    if (len > PLAN_RATES_MAX_BYTES)
        return errf(err, "%s: %zu bytes, at most %u", name, len, PLAN_RATES_MAX_BYTES);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errf(err, "%s: line %d: %s", name, je.line, je.text);
    int rc = read_table(root, r, name, err);
    json_decref(root);
    if (rc) plan_rates_free(r);
    return rc;
}

int plan_rates_load(plan_rates *r, const char *path, errbuf *err) {
    char *text;
    size_t len;
    memset(r, 0, sizeof *r);
    if (file_read_all(path, PLAN_RATES_MAX_BYTES, &text, &len, err)) return -1;
    int rc = plan_rates_parse(r, text, len, path, err);
    free(text);
    return rc;
}

void plan_rates_free(plan_rates *r) {
    free(r->gemm);
    free(r->attention);
    memset(r, 0, sizeof *r);
}
