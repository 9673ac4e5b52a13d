/* crc32c: the Castagnoli CRC (iSCSI polynomial) that guards token caches and checkpoint
 * sections.  Uses the SSE4.2 instruction when the CPU has it, a table otherwise; both give
 * the same values.  Chain calls: crc = crc32c(crc, more, n), starting from 0. */
#ifndef FSDP_CRC32C_H
#define FSDP_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(uint32_t crc, const void *data, size_t len);
/* The CRC of A followed by B from crc(A), crc(B) and B's length: sections read in pieces,
 * in any order, still get their CRC. */
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* The table implementation alone (tests compare the two). */
uint32_t crc32c_portable(uint32_t crc, const void *data, size_t len);

#endif
