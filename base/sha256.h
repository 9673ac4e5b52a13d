/* sha256: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), in plain C, for proving the
 * job secret without sending it (base/auth.h).  Not constant-time in the data's length,
 * which is public in every use here. */
#ifndef FSDP_SHA256_H
#define FSDP_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_BYTES 32 /* digest size */
#define SHA256_BLOCK 64 /* block size (HMAC pads its key to it) */

typedef struct sha256_ctx {
    uint32_t h[8];
    uint64_t len; /* bytes hashed so far */
    unsigned char block[SHA256_BLOCK];
    size_t used; /* bytes waiting in block */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, unsigned char out[SHA256_BYTES]);
void sha256(const void *data, size_t len, unsigned char out[SHA256_BYTES]);

/* HMAC in pieces: init with the key, update with the message (any number of calls), final. */
typedef struct hmac_sha256_ctx {
    sha256_ctx inner, outer;
} hmac_sha256_ctx;

void hmac_sha256_init(hmac_sha256_ctx *c, const void *key, size_t key_len);
void hmac_sha256_update(hmac_sha256_ctx *c, const void *data, size_t len);
void hmac_sha256_final(hmac_sha256_ctx *c, unsigned char out[SHA256_BYTES]);
void hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                 unsigned char out[SHA256_BYTES]);

#endif
