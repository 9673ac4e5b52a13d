/* Fuzzes the checkpoint parsers: an input starting with '{' is a manifest (an accepted one
 * must survive a write/parse round trip and plan every file), anything else a shard-file
 * header (half of the inputs get a correct header CRC patched in, so the fuzzer reaches the
 * checks behind it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "proto/ckpt.h"

static void fuzz_manifest(const uint8_t *data, size_t size) {
    ckpt_manifest m, again;
    errbuf err;
    if (ckpt_manifest_parse(&m, (const char *)data, size, "fuzz.json", &err)) return;
    char *text;
    if (ckpt_manifest_to_json(&m, &text, &err) == 0) {
        if (ckpt_manifest_parse(&again, text, strlen(text), "again.json", &err)) abort();
        ckpt_manifest_free(&again);
        free(text);
    }
    for (int r = 0; r < m.layout.n_files && r < 4; r++) {
        ckpt_file_header h;
        if (ckpt_plan(&h, &m.layout, r, m.step, &err) == 0) ckpt_file_header_free(&h);
    }
    ckpt_manifest_free(&m);
}

static void fuzz_header(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return;
    memcpy(copy, data, size);
    if (size >= CKPT_FIXED_HEADER && (data[size - 1] & 1)) {
        uint32_t len;
        memcpy(&len, copy + 12, 4);
        if (len >= CKPT_FIXED_HEADER && len <= size) {
            static const uint8_t zero[4];
            uint32_t crc = crc32c(crc32c(crc32c(0, copy, 60), zero, 4), copy + 64, len - 64);
            memcpy(copy + 60, &crc, 4);
        }
    }
    ckpt_file_header h;
    errbuf err;
    if (ckpt_decode_header(&h, copy, size, "fuzz.bin", &err) == 0) ckpt_file_header_free(&h);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == '{') fuzz_manifest(data, size);
    else fuzz_header(data, size);
    return 0;
}
