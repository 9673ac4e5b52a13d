/* replica: the stream in which an active node's fsdpd copies its ranks' in-memory checkpoint
 * images to a spare node's (daemon/replica.h), so that a spare taking a lost node's place
 * resumes from memory.  Over a TCP connection that proved the job secret (base/auth.h,
 * context REPLICA_AUTH_CONTEXT), the sender sends images, each:
 *
 *     header (REPLICA_HEADER bytes, little-endian):
 *         0   char[8] magic "FSDPREPL"
 *         8   u32 version (REPLICA_VERSION)
 *         12  u32 node: the sender's index in the run (< nodes)
 *         16  u32 nodes: the run's nodes
 *         20  u32 place: the worker place whose image this is (< places)
 *         24  u32 places: worker places a node
 *         28  u32 0 (reserved)
 *         32  u64 step: the memory step the image holds, sealed
 *         40  u64 bytes: the image bytes that follow (1 .. REPLICA_MAX_BYTES)
 *         48  16 bytes 0 (reserved)
 *     the image's bytes (a shard file in place, proto/ckpt.h)
 *     trailer (8 bytes): "FSDPDONE" when the image still held the step once sent whole, else
 *         "FSDPTORN" (its rank began another save meanwhile): the receiver keeps it only when
 *         DONE and its header decodes with that step.
 *
 * A decoder refuses anything else (magic, version, ranges, reserved bytes) naming the field. */
#ifndef FSDP_REPLICA_H
#define FSDP_REPLICA_H

#include <stdint.h>

#include "base/errbuf.h"

#define REPLICA_MAGIC "FSDPREPL"
#define REPLICA_VERSION 1
#define REPLICA_HEADER 64
#define REPLICA_TRAILER 8
#define REPLICA_DONE "FSDPDONE"
#define REPLICA_TORN "FSDPTORN"
#define REPLICA_MAX_NODES 1024
#define REPLICA_MAX_PLACES 1024
#define REPLICA_MAX_BYTES ((uint64_t)1 << 42) /* 4 TiB: past any shard file */
#define REPLICA_AUTH_CONTEXT "fsdpd replicas"

typedef struct replica_header {
    uint32_t node, nodes, place, places;
    int64_t step;
    uint64_t bytes;
} replica_header;

void replica_encode(const replica_header *h, uint8_t out[REPLICA_HEADER]);
int replica_decode(replica_header *h, const uint8_t in[REPLICA_HEADER], errbuf *err);
/* 1 for DONE, 0 for TORN, -1 (err) for anything else. */
int replica_trailer(const uint8_t in[REPLICA_TRAILER], errbuf *err);

#endif
