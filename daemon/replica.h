/* replica: in-memory checkpoint images copied to the spare nodes (F48; runtime.spare_nodes with
 * checkpoint.memory_interval_steps), so that a spare taking a lost node's place (its fsdpd gone,
 * its memory with it) resumes from memory, not from disk.
 *
 * A spare's fsdpd holds a sink for the launch: a listener on an ephemeral port of every
 * address (its JOIN says the port; the leader's PLAN gives the active nodes every spare's
 * address), a thread a connection (at most REPLICA_MAX_CONNECTIONS) that must prove the
 * current run's job secret within REPLICA_HANDSHAKE_S, then streams images (proto/replica.h)
 * into memory files of the sink's: two for each place of each active node, a stream going
 * into the one with the older step, kept only when it came whole (DONE) and its header
 * decodes with its step; one when two do not fit in half the spare's free memory, none when
 * one does not (logged once, the stream read and dropped).  A spare taking node i's place
 * adopts node i's images as its own places' (memory_ckpt.h), then closes the sink.
 *
 * An active node's fsdpd runs a source for the run: a thread that, once every file of the
 * node's ranks is sealed at a step (the supervisor counts its workers' memory CKPT_DONEs),
 * sends the images holding that step to every spare (the newest step only: one still being
 * sent when a newer comes is followed by the newer), connected and authenticated once a run,
 * again after a failure; a spare that cannot be reached is logged once and tried again at the
 * next step.  Off the critical path: the workers never wait for it. */
#ifndef FSDP_REPLICA_SYNC_H
#define FSDP_REPLICA_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "daemon/memory_ckpt.h"
#include "proto/msg.h"

#define REPLICA_MAX_CONNECTIONS 64
#define REPLICA_HANDSHAKE_S 5.0

typedef struct replica_sink replica_sink;

/* places: worker places a node. */
int replica_sink_open(replica_sink **out, int places, errbuf *err);
int replica_sink_port(const replica_sink *s);
/* The secret a sender must prove: the run's the spare last joined (the leader draws one a run). */
void replica_sink_secret(replica_sink *s, const unsigned char *secret, size_t n);
/* The newest step the sink holds whole of (node, place), -1 for none. */
int64_t replica_sink_step(replica_sink *s, int node, int place);
/* Node `node`'s images become im's (im->fd's, closed first, replaced); 0, or -1 when the sink
 * holds none of that node (im unchanged). */
int replica_sink_adopt(replica_sink *s, int node, memory_images *im, errbuf *err);
void replica_sink_close(replica_sink *s);

typedef struct replica_source replica_source;

/* node of a run of `nodes`, whose first `files` places hold shard files (im: this node's
 * images, borrowed); targets: the spares' "host:port". */
int replica_source_start(replica_source **out, const memory_images *im, int node, int nodes, int files,
                         const msg_peers *targets, const unsigned char *secret, size_t secret_len, errbuf *err);
/* Every file of this node is sealed at `step`: send it (when nothing newer is asked). */
void replica_source_push(replica_source *s, int64_t step);
void replica_source_stop(replica_source *s);

#endif
