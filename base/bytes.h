/* bytes: little-endian codecs for the file and wire formats (whatever the host's byte
 * order, unaligned pointers allowed), hex, and rounding sizes up. */
#ifndef FSDP_BYTES_H
#define FSDP_BYTES_H

#include <stddef.h>
#include <stdint.h>

static inline void le_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void le_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline void le_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t le_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static inline uint32_t le_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t le_get_u64(const uint8_t *p) {
    return (uint64_t)le_get_u32(p) | (uint64_t)le_get_u32(p + 4) << 32;
}

/* n bytes as 2n lower-case hex digits and a NUL. */
static inline void hex_encode(const unsigned char *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = digits[in[i] >> 4], out[2 * i + 1] = digits[in[i] & 15];
    out[2 * n] = '\0';
}

static inline int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Exactly 2n hex digits into n bytes: 0, or -1 for anything else. */
static inline int hex_decode(const char *hex, unsigned char *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hi < 0 ? -1 : hex_digit(hex[2 * i + 1]);
        if (lo < 0) return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return hex[2 * n] == '\0' ? 0 : -1;
}

/* n rounded up to a multiple of `to` (> 0). */
static inline uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

#endif
