/* Fuzzes the token-cache reader.  Half of the inputs get a correct checksum patched in, so
 * the fuzzer reaches the checks behind it (sizes, offsets, token ids); every accepted cache
 * is then read in full through tok_sample. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    if (size >= TOK_HEADER_BYTES && (data[size - 1] & 1)) {
        uint32_t crc = tok_checksum(copy, size);
        memcpy(copy + TOK_CRC_OFFSET, &crc, sizeof crc);
    }
    tok_cache c;
    errbuf err;
    if (tok_parse(&c, copy, size, "fuzz.tokens", &err) == 0) {
        int32_t ids[16], labels[16];
        for (uint64_t r = 0; r < c.n_records; r++) tok_sample(&c, r, 16, ids, labels);
        tok_close(&c);
    }
    free(copy);
    return 0;
}
