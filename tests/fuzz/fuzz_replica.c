/* Fuzzes proto/replica: a header and a trailer of the image stream to a spare, decoded
 * strictly; a header that decodes must encode to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/replica.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t in[REPLICA_HEADER] = {0}, out[REPLICA_HEADER];
    memcpy(in, data, size < sizeof in ? size : sizeof in);
    replica_header h;
    errbuf err;
    if (replica_decode(&h, in, &err) == 0) {
        replica_encode(&h, out);
        if (memcmp(in, out, sizeof in) != 0) abort();
        if (h.node >= h.nodes || h.place >= h.places || h.bytes == 0 || h.step < 0) abort();
    }
    if (size >= REPLICA_HEADER + REPLICA_TRAILER) {
        int t = replica_trailer(data + REPLICA_HEADER, &err);
        if (t < -1 || t > 1) abort();
    }
    return 0;
}
