/* run_record: OUTPUT_DIR/run.json, a job's derived values and summary.  See run_record.h. */
#include "run_record.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/fileio.h"
#include "proto/json_kind.h"

/* One key of an object: its kind and where it lives in the struct. */
typedef enum field_kind {
    F_STR,     /* char[size] */
    F_INT,     /* int64_t, >= 0 */
    F_NUM,     /* double, finite */
    F_BOOL,    /* bool */
    F_NUM_OPT, /* double or null; the bool at flag says which */
    F_LIST,    /* a list of strings: char[max][size], the count (int) at flag */
} field_kind;

typedef struct field {
    const char *key;
    field_kind kind;
    size_t off, size; /* F_LIST: size of one string */
    size_t flag;      /* F_NUM_OPT: the bool; F_LIST: the count */
    int max;          /* F_LIST: most strings */
} field;

#define STR(k, m) {#k, F_STR, offsetof(run_record, m), sizeof(((run_record *)0)->m), 0, 0}
#define INT(k, m) {#k, F_INT, offsetof(run_record, m), 0, 0, 0}
#define NUM(k, m) {#k, F_NUM, offsetof(run_record, m), 0, 0, 0}
#define BOOL(k, m) {#k, F_BOOL, offsetof(run_record, m), 0, 0, 0}

static const field record_fields[] = {
    STR(fsdpd_version, fsdpd_version), STR(cuda_archs, cuda_archs), INT(started, started),
    STR(job_id, job_id), INT(restart, restart), STR(backend, backend), INT(world_size, world_size),
    INT(nodes, nodes), INT(workers_per_node, workers_per_node), INT(micro_batch, micro_batch),
    INT(grad_accum, grad_accum), INT(global_batch, global_batch), INT(seq_len, seq_len),
    INT(tokens_per_step, tokens_per_step), INT(max_steps, max_steps), INT(epochs, epochs),
    STR(train_type, train_type), INT(total_params, total_params), INT(trainable_params, trainable_params),
    INT(lora_rank, lora_rank), NUM(lora_alpha, lora_alpha), NUM(lora_scale, lora_scale),
    {"lora_targets", F_LIST, offsetof(run_record, lora_targets), sizeof(((run_record *)0)->lora_targets[0]),
     offsetof(run_record, n_lora_targets), RUN_MAX_TARGETS},
    STR(quant, quant), BOOL(cpu_offload, cpu_offload), BOOL(offload_params, offload_params),
    STR(recompute, recompute), INT(peak_gpu_bytes, peak_gpu_bytes), STR(compute_dtype, compute_dtype),
    STR(storage_dtype, storage_dtype), STR(dtypes, dtypes), STR(checkpoint_dir, checkpoint_dir),
    STR(output_dir, output_dir), STR(resume_from, resume_from), INT(resume_step, resume_step),
};

#undef STR
#undef INT
#undef NUM
#undef BOOL
#define STR(k) {#k, F_STR, offsetof(run_summary, k), sizeof(((run_summary *)0)->k), 0, 0}
#define INT(k) {#k, F_INT, offsetof(run_summary, k), 0, 0, 0}
#define NUM(k) {#k, F_NUM, offsetof(run_summary, k), 0, 0, 0}
#define BOOL(k) {#k, F_BOOL, offsetof(run_summary, k), 0, 0, 0}
#define OPT(k, flag) {#k, F_NUM_OPT, offsetof(run_summary, k), 0, offsetof(run_summary, flag), 0}

static const field summary_fields[] = {
    INT(ended), INT(steps), INT(tokens), INT(tokens_computed), NUM(wall_s), NUM(tokens_per_s),
    OPT(mfu, has_mfu), NUM(final_loss), OPT(final_eval_loss, has_eval), OPT(best_eval_loss, has_eval),
    INT(best_eval_step),
    {"checkpoints", F_LIST, offsetof(run_summary, checkpoints), sizeof(((run_summary *)0)->checkpoints[0]),
     offsetof(run_summary, n_checkpoints), RUN_MAX_KEPT},
    BOOL(adapter), STR(load),
};

#define N_FIELDS(t) (sizeof t / sizeof t[0])

static json_t *encode(const void *base, const field *f, size_t n, json_t *o) {
    const char *p = base;
    for (size_t i = 0; o && i < n; i++) {
        json_t *v = NULL;
        switch (f[i].kind) {
        case F_STR: v = json_string(p + f[i].off); break;
        case F_INT: v = json_integer(*(const int64_t *)(p + f[i].off)); break;
        case F_NUM: v = json_real(*(const double *)(p + f[i].off)); break;
        case F_BOOL: v = json_boolean(*(const bool *)(p + f[i].off)); break;
        case F_NUM_OPT:
            v = *(const bool *)(p + f[i].flag) ? json_real(*(const double *)(p + f[i].off)) : json_null();
            break;
        case F_LIST:
            v = json_array();
            for (int k = 0; v && k < *(const int *)(p + f[i].flag); k++)
                if (json_array_append_new(v, json_string(p + f[i].off + (size_t)k * f[i].size))) {
                    json_decref(v);
                    v = NULL;
                }
            break;
        }
        if (!v || json_object_set_new(o, f[i].key, v)) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

int run_record_to_json(const run_record *r, char **text, errbuf *err) {
    *text = NULL;
    json_t *o = json_pack("{s:s, s:i}", "format", RUN_RECORD_FORMAT, "version", RUN_RECORD_VERSION);
    o = encode(r, record_fields, N_FIELDS(record_fields), o);
    if (o && json_object_set_new(o, "summary", r->has_summary
                                                   ? encode(&r->summary, summary_fields, N_FIELDS(summary_fields), json_object())
                                                   : json_null())) {
        json_decref(o);
        o = NULL;
    }
    if (o) *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    return *text ? 0 : errf(err, "run.json: out of memory (or a string that is not UTF-8)");
}

static int copy_text(const char *s, char *out, size_t n, const char *name, const char *key, errbuf *err) {
    if (strlen(s) >= n) return errf(err, "%s: \"%s\": longer than %zu bytes", name, key, n - 1);
    strcpy(out, s);
    return 0;
}

static int decode_one(void *base, const field *f, const json_t *v, const char *name, errbuf *err) {
    char *p = base;
    switch (f->kind) {
    case F_STR:
        if (!json_is_string(v)) return errf(err, "%s: \"%s\": expected a string, got %s", name, f->key, json_kind(v));
        return copy_text(json_string_value(v), p + f->off, f->size, name, f->key, err);
    case F_INT:
        if (!json_is_integer(v)) return errf(err, "%s: \"%s\": expected an integer, got %s", name, f->key, json_kind(v));
        if (json_integer_value(v) < 0)
            return errf(err, "%s: \"%s\": %lld is negative", name, f->key, (long long)json_integer_value(v));
        *(int64_t *)(p + f->off) = json_integer_value(v);
        return 0;
    case F_NUM_OPT:
        if (json_is_null(v)) return 0; /* the flag stays false */
        /* fall through */
    case F_NUM:
        if (!json_is_number(v)) return errf(err, "%s: \"%s\": expected a number, got %s", name, f->key, json_kind(v));
        if (!isfinite(json_number_value(v))) return errf(err, "%s: \"%s\": not finite", name, f->key);
        *(double *)(p + f->off) = json_number_value(v);
        if (f->kind == F_NUM_OPT) *(bool *)(p + f->flag) = true;
        return 0;
    case F_BOOL:
        if (!json_is_boolean(v)) return errf(err, "%s: \"%s\": expected a boolean, got %s", name, f->key, json_kind(v));
        *(bool *)(p + f->off) = json_is_true(v);
        return 0;
    case F_LIST: {
        if (!json_is_array(v)) return errf(err, "%s: \"%s\": expected a list, got %s", name, f->key, json_kind(v));
        if (json_array_size(v) > (size_t)f->max)
            return errf(err, "%s: \"%s\": %zu entries, more than %d", name, f->key, json_array_size(v), f->max);
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s))
                return errf(err, "%s: \"%s\"[%zu]: expected a string, got %s", name, f->key, i, json_kind(s));
            if (copy_text(json_string_value(s), p + f->off + i * f->size, f->size, name, f->key, err)) return -1;
        }
        *(int *)(p + f->flag) = (int)json_array_size(v);
        return 0;
    }
    }
    return errf(err, "%s: \"%s\": unknown field kind", name, f->key);
}

/* Every key of o one of fields' (or of extra), every field present. */
static int decode(void *base, const field *f, size_t n, const json_t *o, const char *const *extra, const char *name,
                  errbuf *err) {
    if (!json_is_object(o)) return errf(err, "%s: expected an object, got %s", name, json_kind(o));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        int known = 0;
        for (size_t i = 0; !known && i < n; i++) known = !strcmp(f[i].key, key);
        for (int i = 0; !known && extra && extra[i]; i++) known = !strcmp(extra[i], key);
        if (!known) return errf(err, "%s: unknown key \"%s\"", name, key);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_object_get(o, f[i].key);
        if (!x) return errf(err, "%s: \"%s\" is missing", name, f[i].key);
        if (decode_one(base, &f[i], x, name, err)) return -1;
    }
    return 0;
}

static int check_record(const run_record *r, const char *name, errbuf *err) {
    if (strcmp(r->backend, "cpu") && strcmp(r->backend, "cuda"))
        return errf(err, "%s: \"backend\": '%s' is neither cpu nor cuda", name, r->backend);
    if (strcmp(r->train_type, "full") && strcmp(r->train_type, "lora") && strcmp(r->train_type, "qlora"))
        return errf(err, "%s: \"train_type\": '%s' is none of full, lora, qlora", name, r->train_type);
    if (r->world_size < 1 || r->nodes < 1 || r->workers_per_node < 1 || r->world_size != r->nodes * r->workers_per_node)
        return errf(err, "%s: world_size %lld is not nodes %lld x workers_per_node %lld (each at least 1)", name,
                    (long long)r->world_size, (long long)r->nodes, (long long)r->workers_per_node);
    if (r->micro_batch < 1 || r->grad_accum < 1 || r->micro_batch > INT32_MAX || r->grad_accum > INT32_MAX ||
        r->global_batch != r->micro_batch * r->grad_accum * r->world_size)
        return errf(err, "%s: global_batch %lld is not micro_batch %lld x grad_accum %lld x world_size %lld", name,
                    (long long)r->global_batch, (long long)r->micro_batch, (long long)r->grad_accum,
                    (long long)r->world_size);
    if (r->seq_len > INT32_MAX || r->tokens_per_step != r->global_batch * r->seq_len)
        return errf(err, "%s: tokens_per_step %lld is not global_batch x seq_len %lld", name,
                    (long long)r->tokens_per_step, (long long)r->seq_len);
    if (r->trainable_params > r->total_params && strcmp(r->train_type, "full") == 0)
        return errf(err, "%s: trainable_params %lld is more than total_params %lld in a full fine-tune", name,
                    (long long)r->trainable_params, (long long)r->total_params);
    return 0;
}

int run_record_parse(run_record *r, const char *text, size_t len, const char *name, errbuf *err) {
    memset(r, 0, sizeof *r);
    if (len > RUN_RECORD_MAX) return errf(err, "%s: %zu bytes, more than a run record holds", name, len);
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return errf(err, "%s: not JSON (%s)", name, je.text);
    static const char *const extra[] = {"format", "version", "summary", NULL};
    int rc = decode(r, record_fields, N_FIELDS(record_fields), o, extra, name, err);
    const json_t *format = json_object_get(o, "format"), *version = json_object_get(o, "version"),
                 *summary = json_object_get(o, "summary");
    if (rc == 0 && (!json_is_string(format) || strcmp(json_string_value(format), RUN_RECORD_FORMAT)))
        rc = errf(err, "%s: \"format\" is not \"%s\"", name, RUN_RECORD_FORMAT);
    if (rc == 0 && (!json_is_integer(version) || json_integer_value(version) != RUN_RECORD_VERSION))
        rc = errf(err, "%s: \"version\" is not %d (the one this build reads)", name, RUN_RECORD_VERSION);
    if (rc == 0 && !summary) rc = errf(err, "%s: \"summary\" is missing", name);
    if (rc == 0 && !json_is_null(summary)) {
        char sname[160];
        snprintf(sname, sizeof sname, "%s: summary", name);
        rc = decode(&r->summary, summary_fields, N_FIELDS(summary_fields), summary, NULL, sname, err);
        if (rc == 0 && json_is_null(json_object_get(summary, "final_eval_loss")) !=
                           json_is_null(json_object_get(summary, "best_eval_loss")))
            rc = errf(err, "%s: \"final_eval_loss\" and \"best_eval_loss\" are both numbers or both null", sname);
        r->has_summary = true;
    }
    if (rc == 0) rc = check_record(r, name, err);
    json_decref(o);
    if (rc) memset(r, 0, sizeof *r);
    return rc;
}

int run_record_load(run_record *r, const char *output_dir, errbuf *err) {
    char path[PATH_BYTES];
    if (path_join(path, sizeof path, output_dir, RUN_RECORD_FILE, err)) return -1;
    char *text;
    size_t len;
    if (file_read_all(path, RUN_RECORD_MAX, &text, &len, err)) return -1;
    int rc = run_record_parse(r, text, len, path, err);
    free(text);
    return rc;
}
