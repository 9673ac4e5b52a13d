/* cluster: the fsdpd daemons of one job joined into one job (DESIGN.md, "SLURM, rendezvous,
 * fabric").  One fsdpd per node; the first host of SLURM's node list leads.
 *
 * Rendezvous (cluster_join, before the event loop):
 *   - the leader binds an ephemeral port on its node address (runtime.bind_addr, else the
 *     address SLURMD_NODENAME or the host name resolves to; loopback is refused when there is
 *     more than one node), draws the job secret and a nonce, and publishes host, port, secret,
 *     nonce and the launch (job id, SLURM_STEP_ID, restart count, fsdpd's attempt) in a 0600
 *     file in checkpoint.dir named after the job id, the restart count and the attempt
 *     (written tmp + rename); then it accepts the other nodes until runtime.join_timeout_s,
 *     every connection at once on one poll() loop: each must prove the secret (base/auth.h)
 *     and send its JOIN within HANDSHAKE_S (5 s) of connecting, or it is dropped and logged,
 *     so strangers that say nothing never delay a node.  A JOIN must match the job (node
 *     index and count, workers, the file's nonce, a node index not yet taken) and carry the
 *     same job (job_shared_settings: every key but a node's own, and the model's config.json);
 *     a refusal is sent to the node as REFUSED with its reason.  A node with another job stops
 *     the whole join: every node that joined hears the same reason, and every node exits
 *     non-zero.  The leader names the nodes that never joined;
 *   - every other node waits for a trusted file of this launch up to the same deadline: a
 *     regular file of its own uid with mode 0600 (anything else is refused at once, naming it,
 *     its owner and mode: file_read_private), written for this launch (one of an earlier
 *     srun, or not whole yet, is waited past); it connects, proves the secret by challenge and
 *     response (the secret never travels) and sends JOIN with the nonce it read (proof that
 *     the directory is shared).  A failed attempt (a dead leader's port, a stale file) reads
 *     the file again until the deadline.  The leader's PLAN may resume only from a committed
 *     step of this job's checkpoint.dir (ckpt_adopt).
 * Each attempt of fsdpd's restarts joins anew: the leader decides the run's nodes (members,
 * in the file: after a node is gone, a spare in its place or fewer nodes) and admits its
 * spares too (runtime.spare_nodes: links of their own, no ranks, cluster_stand_by).
 * One node (or none of SLURM) joins nobody: the secret is drawn and kept.
 *
 * Before the loop the leader prepares the checkpoints (ckpt_prepare) and sends every node
 * the run's PLAN: the partial directories' attempt and the checkpoint to resume, or the
 * error that stops the run (cluster_send_plan / cluster_recv_plan).
 *
 * Then the supervisor's loop runs the links (cluster_attach): the leader collects every
 * node's worker addresses (NODE_ADDRS) into the rank table it sends back (PEERS), relays the
 * NCCL id of global rank 0 (NCCL_ID), starts every node once all are ready (NODE_READY,
 * START), and stops every node when one fails (NODE_DONE not ok, or a link lost: STOP with
 * failed).  Checkpoints have one coordinator, the leader's: followers relay their workers'
 * CKPT_DONE and the checkpoint requests made on their node (CKPT_REQUEST) to it, and it
 * sends CKPT_BEGIN to every node and CKPT_ABORT to the node of the rank.  A graceful stop
 * reaches the followers as STOP without failed.
 *
 * Every heartbeat_s each daemon sends NODE_HEARTBEAT (a follower's carries its ranks, for
 * the leader's status); a node not heard from for runtime.node_timeout_s (before its first
 * heartbeat: join_timeout_s) is dead: the job stops on every node, naming it.  A dead leader
 * is found the same way by the others.
 * Global rank = node index x workers per node + local rank. */
#ifndef FSDP_CLUSTER_H
#define FSDP_CLUSTER_H

#include <event2/event.h>

#include "base/errbuf.h"
#include "daemon/slurm.h"
#include "proto/job.h"
#include "proto/msg.h"

struct replica_sink;

typedef struct cluster_hooks {
    void *arg;
    void (*peers)(void *arg, const msg_peers *table); /* every rank's address, global order */
    void (*nccl_id)(void *arg, const msg *id);        /* the id of global rank 0 */
    void (*start)(void *arg);                         /* every node is ready */
    /* failed: another node failed, or a link; else the leader stops the job gracefully;
     * permanent: a failure no restart cures (every node then fails without restarting) */
    void (*stop)(void *arg, const char *reason, int failed, int permanent);
    /* a follower: the leader's CKPT_BEGIN (for every worker) or CKPT_ABORT (for its rank) */
    void (*to_workers)(void *arg, const msg *m);
    /* the leader: a follower's worker's CKPT_DONE; a request made on a follower */
    void (*ckpt_done)(void *arg, const msg_ckpt_done *done);
    void (*ckpt_request)(void *arg, const msg_ckpt_request *req);
    /* for the heartbeats: this node's phase, and (a follower) its ranks' status rows (a new
     * array, as status_rank_rows makes them) */
    const char *(*state)(void *arg);
    json_t *(*ranks)(void *arg);
    /* optional, the leader: rank 0's last METRICS body (a new reference, NULL: none yet), sent
     * in its heartbeats so that a follower's status shows the job's step */
    json_t *(*progress)(void *arg);
} cluster_hooks;

typedef struct cluster cluster;

/* Joins this node's daemon to the others (see above); attempt is fsdpd's own run count,
 * members the run's nodes (node 0 first; the leader decides them, a follower takes them from
 * cluster_members).  This node must be one of them.  spares (the leader's; NULL: none): the
 * spare nodes it admits too, waited for up to join_timeout_s (one that does not come is no
 * spare), kept on links of their own: heartbeats, and STOP when the run fails or ends.
 * memory_step: the in-memory checkpoint this node holds for the run (memory_ckpt_held), -1
 * for none; sent in JOIN. */
int cluster_join(cluster **out, const slurm_env *env, const job_config *job, const msg_nodes *members,
                 const msg_nodes *spares, int attempt, int64_t memory_step, errbuf *err);
/* The leader, once joined: the spares' "host:port" that take copies of the in-memory
 * checkpoints (daemon/replica.h; out->addrs malloc'd, out->n 0 for none). */
int cluster_replica_targets(const cluster *c, msg_peers *out, errbuf *err);
/* The leader, once joined: the in-memory checkpoint every node of the run holds, -1 when
 * not every node holds the same one. */
int64_t cluster_memory_step(const cluster *c);
/* A follower, before cluster_join: the nodes of the attempt's run, from the leader's rendezvous
 * file (waited for up to runtime.join_timeout_s). */
int cluster_members(const slurm_env *env, const job_config *job, int attempt, msg_nodes *out, errbuf *err);
/* The leader, when a failed run is not restarted on several nodes: the attempt's rendezvous
 * file says so (why), and the followers waiting for it stop at once, not at join_timeout_s. */
int cluster_end_launch(const slurm_env *env, const job_config *job, int attempt, const char *why, errbuf *err);
void cluster_free(cluster *c);

int cluster_node(const cluster *c);
/* A follower: the leader's last progress (msg_node_heartbeat.progress), borrowed; NULL when
 * none came yet, and on the leader. */
const json_t *cluster_leader_progress(const cluster *c);
int cluster_nodes(const cluster *c);
const char *cluster_host(const cluster *c);          /* where this node's workers listen */
const char *cluster_secret_hex(const cluster *c);    /* the job secret, hex */

/* The run's plan: the leader sends it to every node (before cluster_attach); a follower
 * waits for it (join_timeout_s), an error in it is the leader's reason not to run. */
int cluster_send_plan(cluster *c, const msg_plan *plan, errbuf *err);
int cluster_recv_plan(cluster *c, msg_plan *plan, errbuf *err);

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
/* A follower: m to the leader (a worker's CKPT_DONE, a CKPT_REQUEST). */
void cluster_to_leader(cluster *c, const msg *m);
/* The leader: m to every other node (CKPT_BEGIN); to the node of `rank` (CKPT_ABORT; nothing
 * for a rank of its own). */
void cluster_to_followers(cluster *c, const msg *m);
void cluster_to_rank(cluster *c, int rank, const msg *m);
/* The leader: a graceful stop of every other node (their workers get STOP). */
void cluster_stop_all(cluster *c, const char *reason);
/* This node failed (the reason): the leader stops every node.  Called again with permanent
 * after a failure that was not, it tells the others that no restart cures it. */
void cluster_fail(cluster *c, const char *reason, int permanent);
/* After the loop: the nodes (SLURM node indices) this run lost — links that closed before
 * their node reported, or fell silent: the leader's view of every follower, a follower's of
 * the leader. */
void cluster_lost(const cluster *c, msg_nodes *out);
/* The leader, after the loop: the spare nodes still joined (SLURM node indices). */
void cluster_spares_alive(const cluster *c, msg_nodes *out);
/* A spare (runtime.spare_nodes), before each attempt: reads the attempt's rendezvous file;
 * 1 when this node is one of its nodes now (*members, then cluster_join), else it joins the
 * leader as a spare and waits, heartbeating, for the run's end: 0 when it failed (the next
 * attempt may need this node), 2 when it ended otherwise (the job is over for a spare);
 * -1 (err) when the leader is lost or refuses it, or ended the launch. */
/* sink (NULL: none): the spare's copies of the nodes' in-memory checkpoints (daemon/replica.h):
 * its port goes in the JOIN, the run's secret to it once joined. */
int cluster_stand_by(const slurm_env *env, const job_config *job, int attempt, struct replica_sink *sink,
                     msg_nodes *members, errbuf *err);
/* This node's workers have all exited (failed: the run failed here).  Returns 1 when the loop may end (a follower: at
 * once, its report written; the leader: once every node has reported, else the cluster
 * breaks the loop when the last one does). */
int cluster_done(cluster *c, int failed);

/* The nodes for the status socket: the leader lists every node ({"node", "host", "role",
 * "connected", "state", "last_heard_s", "ranks"}, the others' ranks from their last
 * heartbeat); a follower itself and the leader (its address and port, no ranks).
 * local_ranks (borrowed) and local_state are this node's. */
json_t *cluster_status(const cluster *c, json_t *local_ranks, const char *local_state);

#endif
