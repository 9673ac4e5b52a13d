/* crc32c: the Castagnoli CRC, SSE4.2 when the CPU has it, else tables; see crc32c.h. */
#include "base/crc32c.h"

#include <string.h>

#define CRC32C_POLY 0x82F63B78u /* reflected Castagnoli polynomial: bit 31 is x^0 */

static uint32_t crc_table[8][256];
static int crc_table_ready;

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    __atomic_store_n(&crc_table_ready, 1, __ATOMIC_RELEASE);
}

/* Slicing-by-8: eight table lookups per 8 input bytes. */
uint32_t crc32c_portable(uint32_t crc, const void *data, size_t len) {
    if (!__atomic_load_n(&crc_table_ready, __ATOMIC_ACQUIRE)) crc_table_init();
    const unsigned char *p = data;
    crc = ~crc;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
              crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
              crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data,
                                                               size_t len) {
    const unsigned char *p = data;
    uint64_t c = ~crc;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

uint32_t crc32c(uint32_t crc, const void *data, size_t len) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return crc32c_sse42(crc, data, len);
#endif
    return crc32c_portable(crc, data, len);
}

/* crc(A B) = crc(A) * x^(8 |B|) + crc(B), in GF(2)[x] modulo the CRC polynomial (as zlib's
 * crc32_combine does). */
static uint32_t gf2_multiply(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
        if (a & bit) product ^= b;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1; /* b *= x */
    }
    return product;
}

/* x^(8 len) modulo the polynomial, by squaring. */
static uint32_t byte_shift(uint64_t len) {
    uint32_t result = 1u << 31, power = 1u << 23; /* x^0, x^8 */
    for (; len; len >>= 1) {
        if (len & 1) result = gf2_multiply(power, result);
        power = gf2_multiply(power, power);
    }
    return result;
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    return gf2_multiply(byte_shift(len_b), crc_a) ^ crc_b;
}
