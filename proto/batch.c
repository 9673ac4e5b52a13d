/* batch: the golden references' batch files (input_ids, labels, positions) read; see batch.h. */
#include "proto/batch.h"

#include <stdlib.h>
#include <string.h>

#include "proto/safetensors.h"

/* One int32 [B,T] tensor of the batch file (I32, or I64 within int32's range). */
static int read_ids(const st_file *f, const char *name, int32_t **out, int *B, int *T,
                    errbuf *err) {
    const st_tensor *t = st_find(f, name);
    if (!t) return errf(err, "%s: tensor %s is missing", f->path, name);
    if (t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0 || t->shape[0] > INT32_MAX ||
        t->shape[1] > INT32_MAX)
        return errf(err, "%s: tensor %s must be a non-empty [B, T] matrix", f->path, name);
    if (t->dtype != ST_I32 && t->dtype != ST_I64)
        return errf(err, "%s: tensor %s has dtype %s, expected I32 or I64", f->path, name,
                    st_dtype_name(t->dtype));
    *B = (int)t->shape[0];
    *T = (int)t->shape[1];
    int32_t *ids = malloc(t->numel * sizeof *ids);
    if (!ids) return errf(err, "%s: out of memory reading %s", f->path, name);
    const unsigned char *p = t->data;
    for (uint64_t i = 0; i < t->numel; i++) {
        if (t->dtype == ST_I32) {
            memcpy(&ids[i], p + 4 * i, 4);
            continue;
        }
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        if (v < INT32_MIN || v > INT32_MAX) {
            free(ids);
            return errf(err, "%s: %s[%llu] = %lld does not fit in int32", f->path, name,
                        (unsigned long long)i, (long long)v);
        }
        ids[i] = (int32_t)v;
    }
    *out = ids;
    return 0;
}

int batch_read(batch_file *b, const char *path, errbuf *err) {
    memset(b, 0, sizeof *b);
    st_file f;
    if (st_open(&f, path, err)) return -1;
    int lb, lt;
    int rc = read_ids(&f, "input_ids", &b->input_ids, &b->B, &b->T, err);
    if (!rc) rc = read_ids(&f, "labels", &b->labels, &lb, &lt, err);
    if (!rc && (lb != b->B || lt != b->T))
        rc = errf(err, "%s: labels [%d, %d] and input_ids [%d, %d] differ in shape", path, lb, lt,
                  b->B, b->T);
    st_close(&f);
    if (rc) batch_free(b);
    return rc;
}

void batch_free(batch_file *b) {
    free(b->input_ids);
    free(b->labels);
    b->input_ids = b->labels = NULL;
}
