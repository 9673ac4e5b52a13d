/* Fuzzes proto/nccl_log: any bytes, a NUL-free transport name that fits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/nccl_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char out[16];
    int found = nccl_log_transport((const char *)data, size, out, sizeof out);
    if (strlen(out) >= sizeof out || found != (out[0] != '\0')) abort();
    return 0;
}
