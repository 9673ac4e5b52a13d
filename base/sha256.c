/* sha256: SHA-256 and HMAC-SHA256 in plain C; see sha256.h. */
#include "base/sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static uint32_t load_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void store_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* FIPS 180-4, 6.2.2: one 64-byte block into the state. */
static void compress(uint32_t h[8], const unsigned char *block) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) w[i] = load_be32(block + 4 * i);
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ch + K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void sha256_init(sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->len = 0;
    c->used = 0;
}

void sha256_update(sha256_ctx *c, const void *data, size_t len) {
    const unsigned char *p = data;
    c->len += len;
    while (len > 0) {
        size_t take = SHA256_BLOCK - c->used < len ? SHA256_BLOCK - c->used : len;
        memcpy(c->block + c->used, p, take);
        c->used += take;
        p += take;
        len -= take;
        if (c->used == SHA256_BLOCK) {
            compress(c->h, c->block);
            c->used = 0;
        }
    }
}

/* Pads with 0x80, zeros and the bit length (big-endian) to a whole block. */
void sha256_final(sha256_ctx *c, unsigned char out[SHA256_BYTES]) {
    uint64_t bits = c->len * 8;
    unsigned char pad[SHA256_BLOCK + 8] = {0x80};
    size_t npad = (c->used < 56 ? 56 : 120) - c->used;
    for (int i = 0; i < 8; i++) pad[npad + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_update(c, pad, npad + 8);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, c->h[i]);
    memset(c, 0, sizeof *c);
}

void sha256(const void *data, size_t len, unsigned char out[SHA256_BYTES]) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data, len);
    sha256_final(&c, out);
}

/* RFC 2104: H((K ^ opad) || H((K ^ ipad) || m)), K hashed first when longer than a block. */
void hmac_sha256_init(hmac_sha256_ctx *c, const void *key, size_t key_len) {
    unsigned char k[SHA256_BLOCK] = {0}, pad[SHA256_BLOCK];
    if (key_len > SHA256_BLOCK)
        sha256(key, key_len, k);
    else if (key_len > 0)
        memcpy(k, key, key_len);
    for (int i = 0; i < SHA256_BLOCK; i++) pad[i] = k[i] ^ 0x36;
    sha256_init(&c->inner);
    sha256_update(&c->inner, pad, SHA256_BLOCK);
    for (int i = 0; i < SHA256_BLOCK; i++) pad[i] = k[i] ^ 0x5c;
    sha256_init(&c->outer);
    sha256_update(&c->outer, pad, SHA256_BLOCK);
    memset(k, 0, sizeof k);
    memset(pad, 0, sizeof pad);
}

void hmac_sha256_update(hmac_sha256_ctx *c, const void *data, size_t len) {
    sha256_update(&c->inner, data, len);
}

void hmac_sha256_final(hmac_sha256_ctx *c, unsigned char out[SHA256_BYTES]) {
    unsigned char inner[SHA256_BYTES];
    sha256_final(&c->inner, inner);
    sha256_update(&c->outer, inner, SHA256_BYTES);
    sha256_final(&c->outer, out);
}

void hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                 unsigned char out[SHA256_BYTES]) {
    hmac_sha256_ctx c;
    hmac_sha256_init(&c, key, key_len);
    hmac_sha256_update(&c, data, len);
    hmac_sha256_final(&c, out);
}
