/* cluster: the fsdpd daemons of one job joined into one job (DESIGN.md, "SLURM, rendezvous,
 * fabric").  One fsdpd per node; the first host of SLURM's node list leads.
 *
 * Rendezvous (cluster_join, before the event loop):
 *   - the leader binds an ephemeral port on its node address (runtime.bind_addr, else the
 *     address SLURMD_NODENAME or the host name resolves to; loopback is refused when there is
 *     more than one node), draws the job secret and a nonce, and publishes host, port, secret
 *     and nonce in a 0600 file in checkpoint.dir named after the job id, the restart count and
 *     fsdpd's attempt (written tmp + rename); then it accepts the other nodes until
 *     runtime.join_timeout_s, and names the nodes that never joined;
 *   - every other node waits for that file up to the same deadline ("no rendezvous file
 *     PATH: checkpoint.dir must be one directory shared by every node"), connects, proves the
 *     secret by challenge and response (base/auth.h: the secret never travels) and sends JOIN
 *     with the nonce it read (proof that the directory is shared).
 * One node (or none of SLURM) joins nobody: the secret is drawn and kept.
 *
 * Then the supervisor's loop runs the links (cluster_attach): the leader collects every
 * node's worker addresses (NODE_ADDRS) into the rank table it sends back (PEERS), relays the
 * NCCL id of global rank 0 (NCCL_ID), starts every node once all are ready (NODE_READY,
 * START), and stops every node when one fails (NODE_DONE not ok, or a link lost: STOP).
 * Global rank = node index x workers per node + local rank. */
#ifndef FSDP_CLUSTER_H
#define FSDP_CLUSTER_H

#include <event2/event.h>

#include "base/errbuf.h"
#include "daemon/slurm.h"
#include "proto/job.h"
#include "proto/msg.h"

typedef struct cluster_hooks {
    void *arg;
    void (*peers)(void *arg, const msg_peers *table); /* every rank's address, global order */
    void (*nccl_id)(void *arg, const msg *id);        /* the id of global rank 0 */
    void (*start)(void *arg);                         /* every node is ready */
    void (*stop)(void *arg, const char *reason);      /* another node failed, or a link */
} cluster_hooks;

typedef struct cluster cluster;

/* Joins this node's daemon to the others (see above); attempt is fsdpd's own run count. */
int cluster_join(cluster **out, const slurm_env *env, const job_config *job, int attempt, errbuf *err);
void cluster_free(cluster *c);

int cluster_node(const cluster *c);
int cluster_nodes(const cluster *c);
const char *cluster_host(const cluster *c);          /* where this node's workers listen */
const char *cluster_secret_hex(const cluster *c);    /* the job secret, hex */

/* From here on the links live on base's loop and report through hooks; cluster_detach
 * closes them (before base is freed). */
int cluster_attach(cluster *c, struct event_base *base, const cluster_hooks *hooks, errbuf *err);
void cluster_detach(cluster *c);

/* This node's workers' addresses (local-rank order): the leader's rank table grows. */
void cluster_addrs(cluster *c, const msg_peers *local);
/* Global rank 0's NCCL id (the leader's): to every node, this one included. */
void cluster_relay_nccl_id(cluster *c, const msg *id);
/* Every worker of this node is ready. */
void cluster_ready(cluster *c);
/* This node failed (the reason): the leader stops every node. */
void cluster_fail(cluster *c, const char *reason);
/* This node's workers have all exited.  Returns 1 when the loop may end (a follower: at
 * once, its report written; the leader: once every node has reported, else the cluster
 * breaks the loop when the last one does). */
int cluster_done(cluster *c);

#endif
