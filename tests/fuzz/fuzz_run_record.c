/* Fuzzes proto/run_record: the input as OUTPUT_DIR/run.json.  A record that parses encodes to
 * text that parses back to the same record; the parser never reads past the bytes it is
 * given. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/run_record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    char *text = malloc(len ? len : 1); /* an exact-size copy: reading past it is caught */
    if (!text) return 0;
    memcpy(text, data, len);
    static run_record r, back;
    errbuf err;
    if (run_record_parse(&r, text, len, "run.json", &err) == 0) {
        char *again;
        if (r.global_batch != r.micro_batch * r.grad_accum * r.world_size) abort();
        if (run_record_to_json(&r, &again, &err) == 0) {
            if (run_record_parse(&back, again, strlen(again), "again", &err) != 0) abort();
            if (memcmp(&r, &back, sizeof r) != 0) abort();
            free(again);
        }
    }
    free(text);
    return 0;
}
