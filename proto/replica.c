/* replica: the image stream to a spare node.  See replica.h. */
#include "proto/replica.h"

#include <string.h>

#include "base/bytes.h"

void replica_encode(const replica_header *h, uint8_t out[REPLICA_HEADER]) {
    memset(out, 0, REPLICA_HEADER);
    memcpy(out, REPLICA_MAGIC, 8);
    le_put_u32(out + 8, REPLICA_VERSION);
    le_put_u32(out + 12, h->node);
    le_put_u32(out + 16, h->nodes);
    le_put_u32(out + 20, h->place);
    le_put_u32(out + 24, h->places);
    le_put_u64(out + 32, (uint64_t)h->step);
    le_put_u64(out + 40, h->bytes);
}

int replica_decode(replica_header *h, const uint8_t in[REPLICA_HEADER], errbuf *err) {
    if (memcmp(in, REPLICA_MAGIC, 8) != 0) return errf(err, "replica stream: bad magic");
    if (le_get_u32(in + 8) != REPLICA_VERSION)
        return errf(err, "replica stream: version %u (this fsdpd reads %d)", le_get_u32(in + 8), REPLICA_VERSION);
    for (int i = 28; i < REPLICA_HEADER; i++)
        if (in[i] && (i < 32 || i >= 48)) return errf(err, "replica stream: reserved byte %d is not 0", i);
    *h = (replica_header){.node = le_get_u32(in + 12), .nodes = le_get_u32(in + 16), .place = le_get_u32(in + 20),
                          .places = le_get_u32(in + 24), .step = (int64_t)le_get_u64(in + 32),
                          .bytes = le_get_u64(in + 40)};
    if (h->nodes < 1 || h->nodes > REPLICA_MAX_NODES || h->node >= h->nodes)
        return errf(err, "replica stream: node %u of %u", h->node, h->nodes);
    if (h->places < 1 || h->places > REPLICA_MAX_PLACES || h->place >= h->places)
        return errf(err, "replica stream: place %u of %u", h->place, h->places);
    if (h->step < 0) return errf(err, "replica stream: step %lld", (long long)h->step);
    if (h->bytes < 1 || h->bytes > REPLICA_MAX_BYTES)
        return errf(err, "replica stream: %llu bytes", (unsigned long long)h->bytes);
    return 0;
}

int replica_trailer(const uint8_t in[REPLICA_TRAILER], errbuf *err) {
    if (!memcmp(in, REPLICA_DONE, REPLICA_TRAILER)) return 1;
    if (!memcmp(in, REPLICA_TORN, REPLICA_TRAILER)) return 0;
    return errf(err, "replica stream: bad trailer");
}
