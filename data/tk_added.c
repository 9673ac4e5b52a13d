/* Added tokens in the text: matched leftmost-longest (as tokenizers' aho-corasick matcher).
 * With split_special a special token's match is still consumed but stays plain text, as
 * tokenizers does with encode_special_tokens, so it hides any overlapping added token. */
#include <stdlib.h>
#include <string.h>

#include "data/tk_internal.h"

static int by_first_byte_longest(const void *a, const void *b) {
    const tk_match_tok *x = a, *y = b;
    unsigned char cx = (unsigned char)x->s[0], cy = (unsigned char)y->s[0];
    if (cx != cy) return cx < cy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return 0;
}

int tk_matcher_build(const tokenizer *tk, tk_matcher *m, int normalized) {
    memset(m, 0, sizeof *m);
    m->tokens = calloc(tk->nadded ? tk->nadded : 1, sizeof *m->tokens);
    if (!m->tokens) return -1;
    tk_buf nb = {0};
    for (size_t i = 0; i < tk->nadded; i++) {
        const tk_added *a = &tk->added[i];
        if (a->normalized != normalized) continue;
        const char *s = a->content;
        size_t len = a->len;
        if (normalized) {
            if (tk_normalize(tk, a->content, a->len, &nb)) goto fail;
            s = nb.p;
            len = nb.n;
        }
        if (len == 0) continue; /* an empty token never matches */
        tk_match_tok *t = &m->tokens[m->n];
        if (!(t->s = malloc(len + 1))) goto fail;
        memcpy(t->s, s, len);
        t->s[len] = 0;
        t->len = len;
        t->id = a->id;
        t->special = a->special;
        m->n++;
    }
    tk_buf_free(&nb);
    qsort(m->tokens, m->n, sizeof *m->tokens, by_first_byte_longest);
    size_t j = 0;
    for (int c = 0; c <= 256; c++) {
        while (j < m->n && (unsigned char)m->tokens[j].s[0] < c) j++;
        m->first[c] = j;
    }
    return 0;
fail:
    tk_buf_free(&nb);
    tk_matcher_free(m);
    return -1;
}

void tk_matcher_free(tk_matcher *m) {
    for (size_t i = 0; i < m->n; i++) free(m->tokens[i].s);
    free(m->tokens);
    memset(m, 0, sizeof *m);
}

static int piece_push(tk_pieces *p, size_t off, size_t len, int32_t id) {
    if (p->n == p->cap) {
        size_t c = p->cap ? p->cap * 2 : 16;
        tk_piece *v = realloc(p->v, c * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = c;
    }
    p->v[p->n++] = (tk_piece){off, len, id};
    return 0;
}

void tk_pieces_free(tk_pieces *p) {
    free(p->v);
    memset(p, 0, sizeof *p);
}

/* The longest token matching at s (n bytes left), or NULL. */
static const tk_match_tok *match_at(const tk_matcher *m, const char *s, size_t n) {
    unsigned char c = (unsigned char)s[0];
    for (size_t k = m->first[c]; k < m->first[c + 1]; k++) {
        const tk_match_tok *t = &m->tokens[k];
        if (t->len <= n && memcmp(t->s, s, t->len) == 0) return t;
    }
    return NULL;
}

int tk_split_added(const tk_matcher *m, const char *s, size_t n, int split_special,
                   tk_pieces *out) {
    out->n = 0;
    size_t i = 0, gap = 0;
    while (m->n && i < n) {
        const tk_match_tok *t = match_at(m, s + i, n - i);
        if (!t) {
            i++;
            continue;
        }
        if (!(split_special && t->special)) {
            if (i > gap && piece_push(out, gap, i - gap, -1)) return -1;
            if (piece_push(out, i, t->len, t->id)) return -1;
            gap = i + t->len;
        }
        i += t->len;
    }
    if (n > gap && piece_push(out, gap, n - gap, -1)) return -1;
    return 0;
}
