/* tokens: the token cache file format, read (mapped, checked) and written; see tokens.h. */
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/grow.h"

typedef struct tok_header {
    char magic[8];
    uint32_t version;
    uint32_t vocab_size;
    uint64_t n_records;
    uint64_t n_tokens;
    uint32_t crc;
    uint32_t format, template_id, reserved0;
    uint8_t tokenizer_sha256[TOK_SHA256_BYTES];
    uint8_t reserved[48];
} tok_header;
_Static_assert(sizeof(tok_header) == TOK_HEADER_BYTES, "token-cache header is 128 bytes");
_Static_assert(offsetof(tok_header, crc) == TOK_CRC_OFFSET, "crc offset");

enum { META_OFFSET = offsetof(tok_header, format) }; /* the header bytes the checksum covers */

uint32_t tok_checksum(const void *buf, size_t len) {
    const unsigned char *b = buf;
    uint32_t crc = crc32c(0, b + META_OFFSET, TOK_HEADER_BYTES - META_OFFSET);
    return crc32c(crc, b + TOK_HEADER_BYTES, len - TOK_HEADER_BYTES);
}

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

const char *tok_format_name(uint32_t format) {
    static const char *const names[] = {"tokens", "alpaca", "chat", "text", "pairs", "preference"};
    return format < sizeof names / sizeof names[0] ? names[format] : "unknown";
}

/* format, template and tokenizer hash go together; reserved bytes are zero. */
static int check_source(const tok_header *h, const char *name, errbuf *err) {
    if (h->reserved0 || !all_zero(h->reserved, sizeof h->reserved))
        return errf(err, "%s: reserved header bytes are not zero", name);
    if (h->format > TOK_FORMAT_PREFERENCE) return errf(err, "%s: unknown format %u", name, h->format);
    if (h->template_id > TOK_TEMPLATE_MAX)
        return errf(err, "%s: unknown template %u", name, h->template_id);
    bool no_hash = all_zero(h->tokenizer_sha256, TOK_SHA256_BYTES);
    if ((h->format == TOK_FORMAT_TOKENS || h->format == TOK_FORMAT_PAIRS) != no_hash)
        return errf(err, "%s: format %u with%s a tokenizer hash", name, h->format,
                    no_hash ? "out" : "");
    bool templated = h->format == TOK_FORMAT_CHAT || h->format == TOK_FORMAT_ALPACA;
    if (h->format != TOK_FORMAT_PREFERENCE && templated != (h->template_id != TOK_TEMPLATE_NONE))
        return errf(err, "%s: format %u with template %u", name, h->format, h->template_id);
    return 0;
}

static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

/* Total file size for a cache of this shape, or 0 when it would overflow. */
static uint64_t tok_file_size(uint64_t n_records, uint64_t n_tokens) {
    uint64_t offsets, tokens, total;
    /* Each part may fit while their sum wraps around: every step is checked. */
    if (n_records > UINT64_MAX / 8 - 1 || n_tokens > UINT64_MAX / 8 ||
        __builtin_mul_overflow(n_records + 1, 8, &offsets) || __builtin_mul_overflow(n_tokens, 4, &tokens) ||
        __builtin_add_overflow(offsets, tokens, &total) ||
        __builtin_add_overflow(total, (uint64_t)TOK_HEADER_BYTES + pad8(n_tokens), &total))
        return 0;
    return total;
}

int tok_parse(tok_cache *c, const void *buf, size_t len, const char *name, errbuf *err) {
    memset(c, 0, sizeof *c);
    if (len < TOK_HEADER_BYTES)
        return errf(err, "%s: %zu bytes is too short for a token cache header", name, len);
    tok_header h;
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, TOK_MAGIC, 8) != 0)
        return errf(err, "%s: not a token cache (bad magic)", name);
    if (h.version != TOK_VERSION)
        return errf(err, "%s: token cache version %u is not supported (this build reads version %d; "
                         "rebuild the cache)", name, h.version, TOK_VERSION);
    if (h.vocab_size == 0 || h.vocab_size > INT32_MAX)
        return errf(err, "%s: vocab_size %u out of range", name, h.vocab_size);
    uint64_t want = tok_file_size(h.n_records, h.n_tokens);
    if (want == 0 || want != len)
        return errf(err, "%s: size %zu does not match %llu records / %llu tokens (expected %llu)",
                    name, len, (unsigned long long)h.n_records, (unsigned long long)h.n_tokens,
                    (unsigned long long)want);
    const unsigned char *base = buf;
    if (tok_checksum(base, len) != h.crc) return errf(err, "%s: checksum mismatch (file corrupt)", name);
    if (check_source(&h, name, err)) return -1;
    if (tok_format_pairs(h.format) && h.n_records % 2)
        return errf(err, "%s: a cache of pairs with an odd count of records (%llu)", name,
                    (unsigned long long)h.n_records);

    c->vocab_size = h.vocab_size;
    c->n_records = h.n_records;
    c->n_tokens = h.n_tokens;
    c->source.format = h.format;
    c->source.template_id = h.template_id;
    memcpy(c->source.tokenizer_sha256, h.tokenizer_sha256, TOK_SHA256_BYTES);
    c->offsets = (const uint64_t *)(base + TOK_HEADER_BYTES);
    c->tokens = (const int32_t *)(base + TOK_HEADER_BYTES + (h.n_records + 1) * 8);
    c->mask = (const uint8_t *)(c->tokens + h.n_tokens);
    if (c->offsets[0] != 0 || c->offsets[h.n_records] != h.n_tokens)
        return errf(err, "%s: record offsets do not span the tokens", name);
    for (uint64_t r = 0; r < h.n_records; r++)
        if (c->offsets[r + 1] < c->offsets[r])
            return errf(err, "%s: record %llu has a negative length", name, (unsigned long long)r);
    for (uint64_t i = 0; i < h.n_tokens; i++) {
        if (c->tokens[i] < 0 || (uint32_t)c->tokens[i] >= h.vocab_size)
            return errf(err, "%s: token %llu has id %d outside [0, %u)", name,
                        (unsigned long long)i, c->tokens[i], h.vocab_size);
        if (c->mask[i] > 1)
            return errf(err, "%s: mask of token %llu is %u, not 0 or 1", name,
                        (unsigned long long)i, c->mask[i]);
    }
    return 0;
}

int tok_read_source(const char *path, tok_source *src, errbuf *err) {
    int fd = file_open_regular(path, err);
    if (fd < 0) return -1;
    tok_header h;
    int rc = file_pread_full(fd, &h, sizeof h, 0, path, err);
    close(fd);
    if (rc) return -1;
    if (memcmp(h.magic, TOK_MAGIC, 8) != 0) return errf(err, "%s: not a token cache (bad magic)", path);
    if (h.version != TOK_VERSION)
        return errf(err, "%s: token cache version %u is not supported (this build reads version %d; "
                         "rebuild the cache)", path, h.version, TOK_VERSION);
    if (check_source(&h, path, err)) return -1;
    src->format = h.format;
    src->template_id = h.template_id;
    memcpy(src->tokenizer_sha256, h.tokenizer_sha256, TOK_SHA256_BYTES);
    return 0;
}

int tok_probe(const char *path, tok_file_kind *kind, errbuf *err) {
    int fd = file_open_regular(path, err);
    if (fd < 0) return -1;
    unsigned char buf[4096];
    size_t have = 0;
    int rc = 0;
    *kind = TOK_FILE_EMPTY;
    for (off_t at = 0;; at += (off_t)have) {
        ssize_t n = pread(fd, buf, sizeof buf, at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = errf(err, "%s: %s", path, strerror(errno));
            break;
        }
        if (at == 0 && (size_t)n >= 8 && memcmp(buf, TOK_MAGIC, 8) == 0) {
            *kind = TOK_FILE_CACHE;
            break;
        }
        have = (size_t)n;
        size_t i = 0;
        while (i < have && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r')) i++;
        if (i < have) {
            *kind = buf[i] == '{' ? TOK_FILE_JSONL : buf[i] == '[' ? TOK_FILE_JSON_ARRAY : TOK_FILE_OTHER;
            break;
        }
        if (have == 0) break;
    }
    close(fd);
    return rc;
}

const char *tok_file_kind_name(tok_file_kind kind) {
    switch (kind) {
    case TOK_FILE_CACHE: return "a token cache";
    case TOK_FILE_JSONL: return "JSONL";
    case TOK_FILE_JSON_ARRAY: return "a JSON array";
    case TOK_FILE_EMPTY: return "empty";
    case TOK_FILE_OTHER: break;
    }
    return "neither a token cache nor JSONL";
}

int tok_open(tok_cache *c, const char *path, errbuf *err) {
    void *map;
    size_t len;
    if (file_map_readonly(path, &map, &len, err) != 0) return -1;
    if (tok_parse(c, map, len, path, err) != 0) {
        if (len) munmap(map, len);
        return -1;
    }
    c->map = map;
    c->map_len = len;
    c->path = strdup(path);
    if (!c->path) {
        tok_close(c);
        return errf(err, "%s: out of memory", path);
    }
    return 0;
}

void tok_close(tok_cache *c) {
    if (c->map && c->map_len) munmap(c->map, c->map_len);
    free(c->path);
    memset(c, 0, sizeof *c);
}

void tok_writer_init(tok_writer *w, uint32_t vocab_size) {
    memset(w, 0, sizeof *w);
    w->vocab_size = vocab_size;
}

int tok_writer_add(tok_writer *w, const int32_t *tokens, const uint8_t *mask, uint64_t n,
                   errbuf *err) {
    for (uint64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= w->vocab_size)
            return errf(err, "record %llu: token id %d outside [0, %u)",
                        (unsigned long long)w->n_records, tokens[i], w->vocab_size);
    size_t cap_mask = w->cap_tokens;
    if (grow_array((void **)&w->offsets, &w->cap_records, w->n_records + 2, sizeof *w->offsets) ||
        grow_array((void **)&w->tokens, &w->cap_tokens, w->n_tokens + n, sizeof *w->tokens) ||
        grow_array((void **)&w->mask, &cap_mask, w->n_tokens + n, sizeof *w->mask))
        return errf(err, "token cache: out of memory at %llu tokens",
                    (unsigned long long)(w->n_tokens + n));
    if (w->n_records == 0) w->offsets[0] = 0;
    if (n) memcpy(w->tokens + w->n_tokens, tokens, n * sizeof *tokens);
    for (uint64_t i = 0; i < n; i++) w->mask[w->n_tokens + i] = mask[i] ? 1 : 0;
    w->n_tokens += n;
    w->offsets[++w->n_records] = w->n_tokens;
    return 0;
}

int tok_writer_save(const tok_writer *w, const char *path, errbuf *err) {
    uint64_t zero_offset = 0;
    const uint64_t *offsets = w->n_records ? w->offsets : &zero_offset;
    static const unsigned char zeros[8];
    size_t pad = pad8(w->n_tokens) - w->n_tokens;
    const file_chunk body[] = {
        {offsets, (w->n_records + 1) * sizeof *offsets},
        {w->tokens, w->n_tokens * sizeof *w->tokens},
        {w->mask, w->n_tokens},
        {zeros, pad},
    };
    tok_header h = {.version = TOK_VERSION, .vocab_size = w->vocab_size, .n_records = w->n_records,
                    .n_tokens = w->n_tokens, .format = w->source.format,
                    .template_id = w->source.template_id};
    memcpy(h.magic, TOK_MAGIC, 8);
    memcpy(h.tokenizer_sha256, w->source.tokenizer_sha256, TOK_SHA256_BYTES);
    h.crc = crc32c(0, (const unsigned char *)&h + META_OFFSET, TOK_HEADER_BYTES - META_OFFSET);
    for (size_t i = 0; i < sizeof body / sizeof body[0]; i++)
        h.crc = crc32c(h.crc, body[i].data, body[i].len);
    const file_chunk all[] = {{&h, sizeof h}, body[0], body[1], body[2], body[3]};
    return file_write_atomic(path, all, sizeof all / sizeof all[0], err);
}

void tok_writer_free(tok_writer *w) {
    free(w->offsets);
    free(w->tokens);
    free(w->mask);
    memset(w, 0, sizeof *w);
}
