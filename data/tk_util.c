/* The tokenizer's small tools: growable buffers, UTF-8, and the two hash maps (strings for the
 * vocabulary and the word cache, id pairs for the merges). */
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "data/tk_internal.h"

int tk_buf_put(tk_buf *b, const void *data, size_t len) {
    if (grow_array((void **)&b->p, &b->cap, b->n + len + 1, 1)) return -1;
    if (len) memcpy(b->p + b->n, data, len);
    b->n += len;
    b->p[b->n] = 0;
    return 0;
}

void tk_buf_free(tk_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int tk_spans_push(tk_spans *s, size_t off, size_t len) {
    if (grow_array((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return -1;
    s->v[s->n++] = (tk_span){off, len};
    return 0;
}

void tk_spans_free(tk_spans *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

int tk_ids_push(tk_ids *a, int32_t id) {
    if (grow_array((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) return -1;
    a->v[a->n++] = id;
    return 0;
}

void tk_ids_free(tk_ids *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* ---- UTF-8 ---------------------------------------------------------------------------- */

size_t utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) k = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (n < 2 || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if (i >= n || (s[i] & 0xC0) != 0x80) return 0;
    return k;
}

size_t utf8_first_invalid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq_len(u + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

uint32_t utf8_decode(const unsigned char *s, size_t k) {
    if (k == 1) return s[0];
    uint32_t cp = s[0] & (0x7F >> k);
    for (size_t i = 1; i < k; i++) cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

size_t utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The length of the longest prefix of a valid sequence at s (at least 1): what one U+FFFD
 * replaces in Rust's from_utf8_lossy (the Unicode "maximal subpart" practice). */
static size_t maximal_subpart(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    unsigned lo = 0x80, hi = 0xBF;
    size_t k;
    if (c >= 0xC2 && c <= 0xDF) k = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 1;
    if (n < 2 || s[1] < lo || s[1] > hi) return 1;
    size_t i = 2;
    while (i < k && i < n && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

int utf8_append_lossy(tk_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* valid bytes [run, i) not yet copied */
    while (i < n) {
        size_t k = u[i] < 0x80 ? 1 : utf8_seq_len(u + i, n - i);
        if (k) {
            i += k;
            continue;
        }
        if (tk_buf_put(b, s + run, i - run) || tk_buf_put(b, "\xEF\xBF\xBD", 3)) return -1;
        i += maximal_subpart(u + i, n - i);
        run = i;
    }
    return tk_buf_put(b, s + run, n - run);
}

/* ---- hash maps -------------------------------------------------------------------------- */

uint64_t tk_hash_bytes(const void *p, size_t n) {
    /* FNV-1a over 8-byte words, then a final mix: fast for short tokens. */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *s++) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static int strmap_rehash(tk_strmap *m, size_t nslots) {
    uint32_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = tk_hash_bytes(m->keys[i], m->klens[i]) & (nslots - 1);
        while (slots[j]) j = (j + 1) & (nslots - 1);
        slots[j] = (uint32_t)i + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->nslots = nslots;
    return 0;
}

/* The slot of k: holding it, or the empty one where it would go. */
static size_t strmap_find(const tk_strmap *m, const char *k, size_t len) {
    size_t j = tk_hash_bytes(k, len) & (m->nslots - 1);
    for (;;) {
        uint32_t e = m->slots[j];
        if (!e) return j;
        if (m->klens[e - 1] == len && memcmp(m->keys[e - 1], k, len) == 0) return j;
        j = (j + 1) & (m->nslots - 1);
    }
}

int tk_strmap_put(tk_strmap *m, const char *k, size_t len, int32_t val) {
    if (len > UINT32_MAX || m->n >= UINT32_MAX - 1) return -1;
    if ((m->n + 1) * 2 > m->nslots && strmap_rehash(m, m->nslots ? m->nslots * 2 : 64)) return -1;
    size_t j = strmap_find(m, k, len);
    if (m->slots[j]) {
        m->vals[m->slots[j] - 1] = val;
        return 0;
    }
    size_t cap = m->cap;
    if (grow_array((void **)&m->keys, &cap, m->n + 1, sizeof *m->keys)) return -1;
    cap = m->cap;
    if (grow_array((void **)&m->klens, &cap, m->n + 1, sizeof *m->klens)) return -1;
    cap = m->cap;
    if (grow_array((void **)&m->vals, &cap, m->n + 1, sizeof *m->vals)) return -1;
    m->cap = cap;
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    if (len) memcpy(copy, k, len);
    copy[len] = 0;
    m->keys[m->n] = copy;
    m->klens[m->n] = (uint32_t)len;
    m->vals[m->n] = val;
    m->slots[j] = (uint32_t)++m->n;
    return 0;
}

int32_t tk_strmap_get(const tk_strmap *m, const char *k, size_t len) {
    if (!m->nslots) return -1;
    uint32_t e = m->slots[strmap_find(m, k, len)];
    return e ? m->vals[e - 1] : -1;
}

void tk_strmap_free(tk_strmap *m) {
    for (size_t i = 0; i < m->n; i++) free(m->keys[i]);
    free(m->keys);
    free(m->klens);
    free(m->vals);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
}

static size_t pair_slot(uint64_t key, size_t nslots) {
    /* splitmix64's finalizer: every key bit reaches the low bits the mask keeps */
    uint64_t h = key;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    return (size_t)h & (nslots - 1);
}

static int pairmap_rehash(tk_pairmap *m, size_t nslots) {
    tk_merge *slots = calloc(nslots, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < m->nslots; i++) {
        if (!m->slots[i].key) continue;
        size_t j = pair_slot(m->slots[i].key, nslots);
        while (slots[j].key) j = (j + 1) & (nslots - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->nslots = nslots;
    return 0;
}

int tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    if ((m->n + 1) * 2 > m->nslots && pairmap_rehash(m, m->nslots ? m->nslots * 2 : 64)) return -1;
    uint64_t key = pair_key(a, b);
    size_t j = pair_slot(key, m->nslots);
    while (m->slots[j].key && m->slots[j].key != key) j = (j + 1) & (m->nslots - 1);
    if (!m->slots[j].key) m->n++;
    m->slots[j] = (tk_merge){key, rank, new_id};
    return 0;
}

const tk_merge *tk_pairmap_get(const tk_pairmap *m, int32_t a, int32_t b) {
    if (!m->nslots) return NULL;
    uint64_t key = pair_key(a, b);
    size_t j = pair_slot(key, m->nslots);
    for (;;) {
        if (m->slots[j].key == key) return &m->slots[j];
        if (!m->slots[j].key) return NULL;
        j = (j + 1) & (m->nslots - 1);
    }
}

void tk_pairmap_free(tk_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}
