/* Fuzzes the token-cache reader.  Half of the inputs get a correct checksum patched in, so
 * the fuzzer reaches the checks behind it (sizes, offsets, token ids); every accepted cache
 * is then read in full through row_fill_record, and packed into rows (data/rows.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/rows.h"
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
        for (uint64_t r = 0; r < c.n_records; r++) row_fill_record(&c, r, 16, ids, labels);
        int32_t start[16], end[16];
        uint64_t *row_start, n_rows;
        if (rows_pack(&c, 16, &row_start, &n_rows, NULL, &err) == 0) {
            for (uint64_t r = 0; r < n_rows; r++)
                row_fill_packed(&c, row_start, r, 16, ids, labels, start, end);
            free(row_start);
        }
        tok_close(&c);
    }
    free(copy);
    return 0;
}
