/* msg: every message two fsdp processes exchange (fsdpd <-> its workers over a socketpair;
 * fsdpd <-> fsdpd over TCP), as typed structs, with the framing, one table of their
 * fields, an encoder and a strict decoder.
 *
 * Framing.  A stream of frames, each a 12-byte header, all little-endian:
 *
 *     offset 0  magic    4 bytes "FSDP"
 *     offset 4  version  u16 (MSG_VERSION)
 *     offset 6  type     u16 (msg_type)
 *     offset 8  length   u32 body bytes, at most MSG_MAX_BODY
 *
 * then the body: a JSON object for every type but NCCL_ID, whose body is the raw bytes of
 * the NCCL unique id.  A bad magic, version, type or length makes the whole stream invalid:
 * the reader drops the peer, it never tries to resynchronise.
 *
 * Bodies.  Each type's fields are one row of the table in msg.c (name, JSON kind, place in
 * the struct, bounds, optional or not); adding a message is a struct here and a row there.
 * The decoder refuses a body with an unknown, missing, mistyped or out-of-range field,
 * naming the message and the field.
 *
 * The daemon reads with the incremental decoder (fed whatever bytes libevent hands it);
 * a worker uses the blocking msg_send / msg_recv. */
#ifndef FSDP_MSG_H
#define FSDP_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errbuf.h"
#include "ckpt.h"
#include "job.h"
#include "model_config.h"

#define MSG_MAGIC "FSDP"
#define MSG_VERSION 1
#define MSG_HEADER_SIZE 12
#define MSG_MAX_BODY (16u << 20) /* enough for a CONFIG or a rank table */

/* Sizes both ends must agree on. */
#define MSG_SECRET_BYTES 32    /* the job secret every connection proves */
#define MSG_NCCL_ID_BYTES 128  /* sizeof(ncclUniqueId) */
#define MSG_ADDR_MAX 80        /* "host:port" of a listener, room for "[ipv6%scope]:port" */
#define MSG_TEXT_MAX 1024      /* reasons and error messages */
#define MSG_NONCE_HEX 33       /* 16 random bytes as hex, with the NUL */
#define MSG_NODES_MAX 1024     /* the nodes one job may run on */

/* w = worker, d = daemon, D = another node's daemon.  The numbers are on the wire: new
 * types go at the end. */
typedef enum msg_type {
    MSG_HELLO = 1,       /* w->d: first message: who the worker is */
    MSG_CONFIG = 2,      /* d->w: the resolved job and the worker's place in it */
    MSG_NCCL_ID = 3,     /* w->d from global rank 0, then d->w: the NCCL unique id (raw bytes) */
    MSG_START = 4,       /* d->w: begin training */
    MSG_HEARTBEAT = 5,   /* w->d: still alive (and where it is) */
    MSG_METRICS = 6,     /* w->d: one optimizer step's figures (rank 0) */
    MSG_CKPT_BEGIN = 7,  /* d->w: a checkpoint is requested */
    MSG_CKPT_DONE = 8,   /* w->d: shard written and fsynced, or why not */
    MSG_CKPT_ABORT = 9,  /* d->w: abandon the save of this step */
    MSG_STOP = 10,       /* d->w: stop (reason) */
    MSG_FATAL = 11,      /* w->d: the worker cannot go on (message) */
    MSG_ADDR = 12,       /* w->d: the address the worker listens on, for the rank table */
    MSG_PEERS = 13,      /* d->w: the rank table (every rank's address) */
    MSG_JOIN = 14,       /* D->d (leader): a node joins the job */
    MSG_NODE_HEARTBEAT = 15, /* D<->d: still alive, and (follower) its ranks, for status */
    MSG_CKPT_REQUEST = 16, /* D->d (leader): a checkpoint or a stop asked for on that node */
    MSG_PLAN = 17,       /* d->D: the run's checkpoint attempt and resume, or why it cannot run */
    MSG_RENDEZVOUS = 18, /* the leader's rendezvous file in checkpoint.dir (not sent) */
    MSG_NODE_ADDRS = 19, /* D->d: a node's workers' addresses, for the rank table */
    MSG_NODE_READY = 20, /* D->d: every worker of a node is connected and ready */
    MSG_NODE_DONE = 21,  /* D->d: a node's workers have exited (ok, or why not) */
    MSG_REFUSED = 22,    /* d->D: the leader will not take this node (why), then it closes */
    MSG_SAMPLE = 23,     /* w->d: one reply to a sample prompt during training (rank 0) */
    MSG_TYPE_END         /* one past the last type */
} msg_type;

/* "HELLO", ...; "UNKNOWN" for a value that is not a type. */
const char *msg_type_name(int type);

/* ---- typed bodies ---- */

typedef struct msg_hello {
    int pid;
} msg_hello;

typedef struct msg_config {
    int rank, world, local_rank, node;
    char bind_host[MSG_ADDR_MAX];
    char secret[2 * MSG_SECRET_BYTES + 1]; /* hex */
    job_config job;                        /* resolved and validated for `world` */
    llama_config model;                    /* the model's config.json, as fsdpd read it */
    int ckpt_attempt;
    char resume_dir[JOB_PATH_MAX];         /* "" to start afresh */
    /* The node's in-memory checkpoint images (daemon/memory_ckpt.h), inherited: worker place
     * k's image s at memory_fd + 2k + s; -1 for none.  The rank saves into its first
     * memory_slots (0: none this run, 1 or 2); memory_resume: it resumes from them (the manifest
     * is resume_dir's memory manifest) */
    int memory_fd;
    int memory_slots;
    bool memory_resume;
    int model_fd;                          /* fsdpd's model memory, -1 for none */
    /* train.sample_prompts, tokenized by fsdpd (msg_sample_prompts_json); NULL: none */
    json_t *samples;
} msg_config;

/* CONFIG's samples, typed: {"prompts": [[ids], ...], "stop_ids": [ids]}, every id in
 * [0, vocab), at least one prompt, none empty. */
typedef struct msg_sample_prompts {
    int n;          /* prompts */
    int32_t *ids;   /* every prompt's ids, one after another */
    int *offsets;   /* [n + 1]: prompt i is ids[offsets[i] .. offsets[i+1]) */
    int n_stop;
    int32_t *stop;
} msg_sample_prompts;

/* A new reference, NULL when out of memory. */
json_t *msg_sample_prompts_json(const msg_sample_prompts *p);
/* Strictly; free with msg_sample_prompts_free. */
int msg_sample_prompts_read(const json_t *j, int vocab, msg_sample_prompts *out, errbuf *err);
void msg_sample_prompts_free(msg_sample_prompts *p);

/* SAMPLE: the reply the model at `step` gives prompt `prompt_index` of train.sample_prompts,
 * greedily: its ids (an array of token ids, at least one; msg_ids_json, msg_ids_read) and
 * why it ended ("stop", "length", "positions"). */
typedef struct msg_sample {
    int64_t step;
    int prompt_index;
    json_t *reply_ids;
    char stop[16];
} msg_sample;

json_t *msg_ids_json(const int32_t *ids, int n);
/* An array of n >= 1 integers in [0, INT32_MAX] into *ids (malloc'd). */
int msg_ids_read(const json_t *a, int32_t **ids, int *n, errbuf *err);

typedef struct msg_nccl_id {
    unsigned char id[MSG_NCCL_ID_BYTES];
} msg_nccl_id;

/* A rank's collectives (worker/comm.h, comm_progress): the last started (its sequence
 * number, collective and unit, -1 for none) and the highest finished. */
typedef struct msg_coll {
    int64_t started, finished;
    char op[16];
    int unit;
} msg_coll;

/* A rank's network, in its ready heartbeat: the transport its collectives use ("tcp" for
 * fsdpd's rings; NCCL's as its log says: "IB", "Socket", ..., "" unknown) and, after the
 * network check (fabric.preflight), the bus bandwidth it measured. */
typedef struct msg_net {
    char transport[32];
    bool measured;
    double busbw_gbps;
} msg_net;

/* A rank's time over its steps so far (this run), summed: each step from its loop's top to
 * its end, of that the time in collectives (on NCCL their device time) and in filling the
 * batch.  The stragglers' watch (daemon/straggler.h) compares the ranks' own time, the rest. */
typedef struct msg_timing {
    int64_t steps;
    double step_s, comm_s, data_s;
} msg_timing;

typedef struct msg_heartbeat {
    bool ready;         /* set once: connected to the peers, ready to START */
    bool has_step;
    int64_t step;       /* optimizer steps done */
    bool has_progress;
    int64_t progress;   /* units of training done (steps, evaluation batches, sample replies;
                         * 1 once the loop has begun): the daemon's stall watch */
    bool has_mem_bytes;
    int64_t mem_bytes;  /* context memory in use after the last step */
    bool has_coll;
    msg_coll coll;
    bool has_net;
    msg_net net;
    bool has_timing;
    msg_timing timing;
} msg_heartbeat;

/* The checkpoint a step triggers, announced before it is written. */
typedef struct msg_ckpt_note {
    int64_t step;
    int attempt;
    char mode[8];       /* "async", "sync", "skipped" */
    int64_t request;    /* checkpoint requests up to this id are served by it */
} msg_ckpt_note;

typedef struct msg_metrics {
    int64_t step, total_steps;
    double loss, lr, grad_norm;
    int64_t tokens, tokens_seen;
    double seconds;
    int64_t layer_forwards, mem_bytes, mem_peak_bytes;
    /* rank 0's collectives so far: units all-gathered (fsdp's param_gathers), and every
     * collective on the replica communicator (hybrid_shard's across the nodes; 0 without) */
    int64_t all_gathers, replica_collectives;
    int64_t gathered_bytes; /* rank 0's bytes sent into all-gathers on its shard communicator */
    bool has_checkpoint;
    msg_ckpt_note checkpoint;
    bool has_eval_loss;
    double eval_loss;   /* after this step, over the held-out samples (data.eval_fraction) */
    /* train.objective dpo and orpo: TRL's figures under TRL's names ("rewards/chosen", ...;
     * nll_loss, log_odds_ratio and log_odds_chosen: ORPO's), means over the step's pairs. */
    bool has_rewards_chosen, has_rewards_rejected, has_rewards_accuracies, has_rewards_margins;
    double rewards_chosen, rewards_rejected, rewards_accuracies, rewards_margins;
    bool has_logps_chosen, has_logps_rejected;
    double logps_chosen, logps_rejected;
    bool has_nll_loss, has_log_odds_ratio, has_log_odds_chosen;
    double nll_loss, log_odds_ratio, log_odds_chosen;
} msg_metrics;

typedef struct msg_ckpt_begin {
    int64_t request;
    bool stop;          /* SIGTERM: a synchronous save after the step in progress, then stop */
    bool sync;          /* a synchronous save whatever checkpoint.async says (a failed save's retry) */
} msg_ckpt_begin;

typedef struct msg_ckpt_done {
    int64_t step;
    int attempt, rank;
    bool sync, ok, aborted;
    /* An in-memory save: the rank's image in the node's memory (msg_config.memory_dir) holds
     * this step, sealed; no file was written.  A disk save sends one of these first. */
    bool memory;
    char error[MSG_TEXT_MAX]; /* "" when ok */
    char file[CKPT_NAME_MAX]; /* the shard file's name in the checkpoint directory */
    int64_t bytes;
    int64_t header_crc32c;
    double stage_s, write_s;
    /* rank 0, when ok: */
    bool has_optimizer_step;
    int64_t optimizer_step;
    bool has_tokens_seen;
    int64_t tokens_seen;
    json_t *units;      /* the flat layouts (ckpt_layout_to_json); NULL when absent */
} msg_ckpt_done;

typedef struct msg_ckpt_abort {
    int64_t step;
    int attempt;
    int rank;           /* the global rank it is for (a daemon relays it to that worker) */
} msg_ckpt_abort;

typedef struct msg_stop {
    char reason[MSG_TEXT_MAX];
    bool failed;        /* the job failed (between daemons: the receiver fails too) */
    bool permanent;     /* and no restart can cure it (between daemons; a worker ignores it) */
} msg_stop;

typedef struct msg_fatal {
    char message[MSG_TEXT_MAX];
    bool permanent;     /* no restart can cure it: the job, model, checkpoint or data */
} msg_fatal;

typedef struct msg_addr {
    char addr[MSG_ADDR_MAX];
} msg_addr;

typedef struct msg_peers {
    int n;
    char (*addrs)[MSG_ADDR_MAX]; /* [n], malloc'd */
} msg_peers;

typedef struct msg_join {
    int node, nodes;    /* this node's index and the node count it was told (a spare: 0, the count) */
    int slurm_node;     /* its SLURM node index (SLURM_NODEID) */
    bool standby;       /* a spare node (runtime.spare_nodes): joined, no ranks, until it is needed */
    char host[MSG_ADDR_MAX];
    int workers;
    char nonce[MSG_NONCE_HEX]; /* the rendezvous file's: proof that checkpoint.dir is shared */
    /* The in-memory checkpoint this node holds whole for its ranks of the run (the step of
     * checkpoint.dir's memory manifest, its files checked), -1 for none */
    int64_t memory_step;
    /* A spare: the port its copies of the in-memory checkpoints come to (daemon/replica.h),
     * 0 for none */
    int replica_port;
    json_t *settings;   /* the node's resolved job as every node must share it (job_shared_settings) */
} msg_join;

/* The nodes of one run, by SLURM node index (SLURM_NODEID), in the run's node order: node
 * i of the run is SLURM node id[i]; id[0] is 0, the leader. */
typedef struct msg_nodes {
    int n;
    int id[MSG_NODES_MAX];
} msg_nodes;

/* Writes "0, 2, 5" (n's indices) into out[size], cut short to fit. */
void msg_nodes_list(const msg_nodes *n, char *out, size_t size);

typedef struct msg_rendezvous {
    char host[MSG_ADDR_MAX];  /* the leader's address and port */
    int port;
    int nodes;
    char job_id[64];
    int restart, attempt;     /* SLURM_RESTART_COUNT and fsdpd's own run attempt */
    char launch[128];         /* the launch it was written for: job, step, restart, attempt */
    char secret[2 * MSG_SECRET_BYTES + 1]; /* hex; the file is 0600 */
    char nonce[MSG_NONCE_HEX];
    msg_nodes members;        /* the run's nodes (n == nodes; after a shrink, not every node) */
    /* Not "": no run of this attempt comes, the leader ended the launch (why; port may be 0):
     * the followers waiting for it stop at once. */
    char ended[MSG_TEXT_MAX];
} msg_rendezvous;

typedef struct msg_node_addrs {
    int node;
    msg_peers list;     /* that node's workers in local-rank order */
} msg_node_addrs;

typedef struct msg_node {
    int node;
} msg_node;             /* NODE_READY */

typedef struct msg_node_done {
    int node;
    bool ok;
    bool permanent;     /* not ok, and no restart can cure it */
    char error[MSG_TEXT_MAX]; /* not ok: the node's failure; "" when it stopped for the leader's */
} msg_node_done;

/* NODE_HEARTBEAT.  ranks: a follower's rows for the leader's status, each
 * {"rank", "pid", "running", "host_rss_bytes", "gpu_bytes"} (the two memory figures integer
 * or null); NULL (absent) from the leader. */
typedef struct msg_node_heartbeat {
    int node;
    char state[16];     /* the supervisor's phase: setup, training, stopping */
    json_t *ranks;
    json_t *progress;   /* the leader's: rank 0's last METRICS body (a follower's status shows
                         * the job's step); NULL: none yet, or a follower's heartbeat */
} msg_node_heartbeat;

/* CKPT_REQUEST: kind "checkpoint" (SIGUSR1, fsdpctl checkpoint), "stop" (fsdpctl stop: a
 * checkpoint, then STOP) or "stop_sync" (SIGTERM: a synchronous one, no step after it). */
typedef struct msg_ckpt_request {
    char kind[16];
    char why[MSG_TEXT_MAX];
} msg_ckpt_request;

/* REFUSED: why the leader turned this node away (a JOIN that does not fit the job). */
typedef struct msg_refused {
    char reason[MSG_TEXT_MAX];
} msg_refused;

/* PLAN: what the leader's ckpt_prepare found, for every node's workers: the partial
 * directories' attempt number and the checkpoint to resume ("" for none); or error. */
typedef struct msg_plan {
    int attempt;
    char resume_dir[JOB_PATH_MAX];
    /* >= 0: resume instead from the in-memory checkpoint of this step, which every node said
     * it holds (msg_join.memory_step); resume_dir is then "" */
    int64_t memory_step;
    /* The spares' "host:port" the nodes copy their in-memory checkpoint images to (absent:
     * none) */
    bool has_replicas;
    msg_peers replicas;
    char error[MSG_TEXT_MAX];
} msg_plan;

/* One message: its type and the body of that type (START has none). */
typedef struct msg {
    msg_type type;
    union {
        msg_hello hello;
        msg_config config;
        msg_nccl_id nccl_id;
        msg_heartbeat heartbeat;
        msg_metrics metrics;
        msg_ckpt_begin ckpt_begin;
        msg_ckpt_done ckpt_done;
        msg_ckpt_abort ckpt_abort;
        msg_stop stop;
        msg_fatal fatal;
        msg_addr addr;
        msg_peers peers;
        msg_join join;
        msg_node_heartbeat node_heartbeat;
        msg_ckpt_request ckpt_request;
        msg_plan plan;
        msg_rendezvous rendezvous;
        msg_node_addrs node_addrs;
        msg_node node_ready;
        msg_node_done node_done;
        msg_refused refused;
        msg_sample sample;
    } u;
} msg;

/* Releases what a decoded or built message owns (json references, the rank table). */
void msg_free(msg *m);

/* The body as JSON (a new reference; NULL when out of memory).  Also what fsdpd writes to
 * metrics.jsonl for METRICS.  Not for NCCL_ID. */
json_t *msg_to_json(const msg *m, errbuf *err);
/* A body of `type` from its JSON object, strictly (see above).  On failure *m holds
 * nothing to free.  A CONFIG's job is read strictly, its grad_accum recomputed and validated
 * for its world (job_from_object, job_resolve, job_validate). */
int msg_from_json(msg *m, msg_type type, const json_t *body, errbuf *err);

/* ---- frames ---- */

/* A received frame.  body is malloc'd and NUL-terminated (body[len] == 0). */
typedef struct msg_frame {
    msg_type type;
    uint32_t len;
    char *body;
} msg_frame;

void msg_frame_free(msg_frame *f);

/* Writes the header of a frame whose body is body_len bytes. */
int msg_encode_header(uint8_t header[MSG_HEADER_SIZE], int type, size_t body_len, errbuf *err);
/* A whole frame (header + body), malloc'd into *out. */
int msg_frame_encode(int type, const void *body, size_t len, uint8_t **out, size_t *frame_len,
                     errbuf *err);
/* The whole frame of m (header and body), malloc'd into *out. */
int msg_encode(const msg *m, uint8_t **out, size_t *len, errbuf *err);
/* The typed message a frame carries. */
int msg_decode(const msg_frame *f, msg *m, errbuf *err);

/* Incremental reader for a non-blocking socket.  Feed it bytes as they arrive and take
 * whole frames out with msg_decoder_next until it returns 0.  Once it has returned -1 the
 * stream is broken and it keeps returning -1. */
typedef struct msg_decoder {
    uint8_t *buf;
    size_t start, end, cap; /* unread bytes are buf[start, end) */
    int broken;             /* why is in `error` */
    errbuf error;
} msg_decoder;

void msg_decoder_init(msg_decoder *d);
void msg_decoder_free(msg_decoder *d);
/* Appends bytes (copied); fails only when out of memory.  Bytes fed to a broken stream are
 * dropped. */
int msg_decoder_feed(msg_decoder *d, const void *data, size_t len, errbuf *err);
/* 1: *out holds the next frame (the caller frees it with msg_frame_free); 0: more bytes are
 * needed; -1: the stream is malformed (bad magic, version, type or length). */
int msg_decoder_next(msg_decoder *d, msg_frame *out, errbuf *err);
/* Bytes received but not yet returned as a frame (non-zero at EOF: a truncated frame). */
size_t msg_decoder_buffered(const msg_decoder *d);

/* Blocking I/O for workers.  msg_send writes the whole frame (retrying partial writes and
 * EINTR; MSG_NOSIGNAL, so a closed peer is an error, not SIGPIPE).  msg_recv reads exactly
 * one message; timeout_ms < 0 waits forever.  The end of the stream is the error "peer
 * closed".  msg_recv_frame is the same without decoding the body. */
int msg_send(int fd, const msg *m, errbuf *err);
int msg_recv(int fd, msg *m, int timeout_ms, errbuf *err);
int msg_send_frame(int fd, int type, const void *body, size_t len, errbuf *err);
int msg_recv_frame(int fd, msg_frame *out, int timeout_ms, errbuf *err);

#endif
