/* The BPE model on one word (a pre-tokenized piece): its characters become symbols (byte
 * fallback and unk as `tokenizers` does them), then merges apply lowest rank first (leftmost
 * among equals) through a heap, exactly as tokenizers' Word::merge_all, so even unusual merge
 * tables give the same ids.  A cache keeps the ids of recent words. */
#include <stdlib.h>
#include <string.h>

#include "data/tk_internal.h"

enum { CACHE_MAX_WORD = 256, CACHE_MAX_WORDS = 1 << 16, CACHE_MAX_IDS = 1 << 22 };

static int syms_reserve(tk_state *st, size_t n) {
    if (n <= st->syms_cap) return 0;
    size_t c = st->syms_cap ? st->syms_cap : 64;
    while (c < n) c *= 2;
    tk_symbol *p = realloc(st->syms, c * sizeof *p);
    if (!p) return -1;
    st->syms = p;
    st->syms_cap = c;
    return 0;
}

static void sym_add(tk_state *st, size_t *n, int32_t id, uint32_t len) {
    tk_symbol *s = &st->syms[*n];
    s->id = id;
    s->len = len;
    s->prev = (int32_t)*n - 1;
    s->next = (int32_t)*n + 1;
    (*n)++;
}

static int32_t char_id(const tokenizer *tk, const unsigned char *c, size_t k) {
    if (k <= 3) {
        uint32_t cp = utf8_decode(c, k);
        if (cp < TK_BMP) return tk->char_ids[cp];
    }
    return tk_strmap_get(&tk->vocab, (const char *)c, k);
}

/* The word's characters as symbols (tokenizers' BPE::merge_word before merge_all). */
static int initial_symbols(tk_state *st, const char *w, size_t n, size_t *count, errbuf *err) {
    const tokenizer *tk = st->tk;
    const unsigned char *u = (const unsigned char *)w;
    /* At most 4 byte symbols per character, so n * 1 bytes suffice plus the unk. */
    if (syms_reserve(st, n + 1)) return errf(err, "out of memory");
    size_t ns = 0, i = 0;
    int32_t unk_len = -1; /* a pending unk symbol of this many bytes */
    while (i < n) {
        size_t k = utf8_seq_len(u + i, n - i);
        if (!k) return errf(err, "internal error: invalid UTF-8 inside a word");
        int32_t id = char_id(tk, u + i, k);
        if (id >= 0) {
            if (unk_len >= 0) sym_add(st, &ns, tk->unk_id, (uint32_t)unk_len);
            unk_len = -1;
            sym_add(st, &ns, id, (uint32_t)k);
            i += k;
            continue;
        }
        int all_bytes = tk->byte_fallback;
        for (size_t j = 0; all_bytes && j < k; j++) all_bytes = tk->byte_ids[u[i + j]] >= 0;
        if (all_bytes) {
            /* as tokenizers: a pending unk is not flushed before byte tokens */
            for (size_t j = 0; j < k; j++) sym_add(st, &ns, tk->byte_ids[u[i + j]], 1);
            i += k;
            continue;
        }
        if (tk->has_unk_token) {
            if (tk->unk_id < 0)
                return errf(err, "the model's unk_token \"%s\" is not in its vocab", tk->unk_token);
            if (unk_len >= 0 && tk->fuse_unk) unk_len += (int32_t)k;
            else {
                if (unk_len >= 0) sym_add(st, &ns, tk->unk_id, (uint32_t)unk_len);
                unk_len = (int32_t)k;
            }
        } /* without an unk_token, tokenizers drops the character */
        i += k;
    }
    if (unk_len >= 0) sym_add(st, &ns, tk->unk_id, (uint32_t)unk_len);
    if (ns) st->syms[ns - 1].next = -1;
    *count = ns;
    return 0;
}

static int heap_less(const tk_heap_item *a, const tk_heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(tk_state *st, size_t *n, tk_heap_item it) {
    if (*n == st->heap_cap) {
        size_t c = st->heap_cap ? st->heap_cap * 2 : 64;
        tk_heap_item *p = realloc(st->heap, c * sizeof *p);
        if (!p) return -1;
        st->heap = p;
        st->heap_cap = c;
    }
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&it, &st->heap[parent])) break;
        st->heap[i] = st->heap[parent];
        i = parent;
    }
    st->heap[i] = it;
    return 0;
}

static tk_heap_item heap_pop(tk_state *st, size_t *n) {
    tk_heap_item top = st->heap[0], last = st->heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&st->heap[c + 1], &st->heap[c])) c++;
        if (!heap_less(&st->heap[c], &last)) break;
        st->heap[i] = st->heap[c];
        i = c;
    }
    if (*n) st->heap[i] = last;
    return top;
}

static int push_pair(tk_state *st, size_t *nh, size_t pos) {
    const tk_symbol *s = &st->syms[pos];
    if (s->next < 0) return 0;
    const tk_merge *m = tk_pairmap_get(&st->tk->merges, s->id, st->syms[s->next].id);
    if (!m) return 0;
    return heap_push(st, nh, (tk_heap_item){m->rank, (uint32_t)pos, m->new_id});
}

static int merge_all(tk_state *st, size_t ns, errbuf *err) {
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        if (push_pair(st, &nh, i)) return errf(err, "out of memory");
    while (nh) {
        tk_heap_item top = heap_pop(st, &nh);
        tk_symbol *s = &st->syms[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        tk_symbol *right = &st->syms[s->next];
        const tk_merge *m = tk_pairmap_get(&st->tk->merges, s->id, right->id);
        if (!m || m->new_id != top.new_id) continue; /* an expired entry */
        s->id = top.new_id;
        s->len += right->len;
        s->next = right->next;
        right->len = 0;
        if (s->next >= 0) st->syms[s->next].prev = (int32_t)top.pos;
        if (s->prev >= 0 && push_pair(st, &nh, (size_t)s->prev)) return errf(err, "out of memory");
        if (push_pair(st, &nh, top.pos)) return errf(err, "out of memory");
    }
    return 0;
}

static int cache_put(tk_state *st, const char *w, size_t n, const int32_t *ids, size_t count) {
    if (st->cache.n >= CACHE_MAX_WORDS || st->cache_ids.n + count + 1 > CACHE_MAX_IDS) {
        tk_strmap_free(&st->cache);
        st->cache_ids.n = 0;
    }
    size_t at = st->cache_ids.n;
    if (tk_ids_push(&st->cache_ids, (int32_t)count)) return -1;
    for (size_t i = 0; i < count; i++)
        if (tk_ids_push(&st->cache_ids, ids[i])) return -1;
    return tk_strmap_put(&st->cache, w, n, (int32_t)at);
}

int tk_bpe_word(tk_state *st, const char *w, size_t n, tk_ids *out, errbuf *err) {
    const tokenizer *tk = st->tk;
    if (n == 0) return 0;
    if (tk->ignore_merges) {
        int32_t id = tk_strmap_get(&tk->vocab, w, n);
        if (id >= 0) return tk_ids_push(out, id) ? errf(err, "out of memory") : 0;
    }
    int cacheable = n <= CACHE_MAX_WORD;
    if (cacheable) {
        int32_t at = tk_strmap_get(&st->cache, w, n);
        if (at >= 0) {
            const int32_t *run = st->cache_ids.v + at;
            for (int32_t i = 1; i <= run[0]; i++)
                if (tk_ids_push(out, run[i])) return errf(err, "out of memory");
            return 0;
        }
    }
    size_t ns = 0;
    if (initial_symbols(st, w, n, &ns, err) || merge_all(st, ns, err)) return -1;
    size_t first = out->n;
    for (size_t i = 0; i < ns; i++)
        if (st->syms[i].len && tk_ids_push(out, st->syms[i].id)) return errf(err, "out of memory");
    if (cacheable && cache_put(st, w, n, out->v + first, out->n - first))
        return errf(err, "out of memory");
    return 0;
}
