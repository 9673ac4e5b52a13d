/* The normalizers: Prepend (only to non-empty text, as tokenizers does), Replace with a
 * String pattern (non-overlapping, left to right; an empty pattern replaces nothing) and NFC
 * (tk_nfc.c), applied in the order of the (flattened) Sequence. */
#include <string.h>

#include "data/tk_internal.h"

int tk_replace_all(const char *a, size_t alen, const char *b, size_t blen, const char *s,
                   size_t n, tk_buf *out) {
    size_t i = 0, run = 0;
    if (alen == 0) return tk_buf_put(out, s, n);
    while (i + alen <= n) {
        if (memcmp(s + i, a, alen) == 0) {
            if (tk_buf_put(out, s + run, i - run) || tk_buf_put(out, b, blen)) return -1;
            i += alen;
            run = i;
        } else i++;
    }
    return tk_buf_put(out, s + run, n - run);
}

static int apply(const tk_norm *nm, const char *s, size_t n, tk_buf *out) {
    out->n = 0;
    if (nm->kind == NORM_NFC) return tk_nfc(s, n, out);
    if (nm->kind == NORM_PREPEND) {
        if (n && tk_buf_put(out, nm->a, nm->alen)) return -1;
        return tk_buf_put(out, s, n);
    }
    return tk_replace_all(nm->a, nm->alen, nm->b, nm->blen, s, n, out);
}

int tk_normalize(const tokenizer *tk, const char *s, size_t n, tk_buf *out) {
    out->n = 0;
    if (tk_buf_put(out, s, n)) return -1;
    tk_buf tmp = {0};
    for (size_t i = 0; i < tk->nnorms; i++) {
        if (apply(&tk->norms[i], out->p, out->n, &tmp)) {
            tk_buf_free(&tmp);
            return -1;
        }
        tk_buf swap = *out;
        *out = tmp;
        tmp = swap;
    }
    tk_buf_free(&tmp);
    return 0;
}
