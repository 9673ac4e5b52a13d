/* Fuzzes proto/ckpt_lock: the input as a checkpoint directory's lock file (fsdpd.lock).  A
 * holder that parses encodes to text that parses back to the same holder, and its description
 * fits; the parser never reads past the bytes it is given. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/ckpt_lock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    char *text = malloc(len ? len : 1); /* an exact-size copy: reading past it is caught */
    if (!text) return 0;
    memcpy(text, data, len);
    ckpt_lock_holder h, back;
    errbuf err;
    if (ckpt_lock_parse(&h, text, len, "fsdpd.lock", &err) == 0) {
        char *again, who[512];
        if (h.pid < 1 || !h.host[0]) abort();
        if (ckpt_lock_to_json(&h, &again, &err) == 0) {
            if (ckpt_lock_parse(&back, again, strlen(again), "again", &err) != 0) abort();
            if (memcmp(&h, &back, sizeof h) != 0) abort();
            free(again);
        }
        ckpt_lock_describe(&h, who, sizeof who);
        if (strlen(who) >= sizeof who) abort();
    }
    free(text);
    return 0;
}
