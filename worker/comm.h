/* comm: collectives between the workers of a job, backend-neutral.
 *
 * A communicator joins `world` ranks (one per worker).  Every call below is collective: all
 * ranks make the same calls in the same order with the same count, dtype, op and root.
 * Buffers are contiguous (host memory on the CPU backend, device memory on NCCL).  The CPU
 * backend (comm_tcp.c) runs rings over TCP; the GPU backend (comm_nccl.h) builds the same
 * `comm` with its own constructor, and everything from comm_rank() down stays the same.
 *
 *   comm_listener l;
 *   comm_tcp_listen(&l, "10.0.0.7", err);        publish l.addr ("10.0.0.7:41234") to the job
 *   ... every rank's address gathered into a comm_rank_table ...
 *   comm_init(&c, &opt, rank, &table, &l, err);   connect; l is closed from here on
 *   comm_all_gather(c, shard, full, shard_count, COMM_BF16, err); ...
 *   comm_destroy(c);
 *
 * Counts are per rank: all_gather and reduce_scatter move world*count elements in total.
 * Sizes that do not divide by the world size are the CALLER's job: pad the flat buffer to a
 * multiple of the world size (FSDP pads every flat parameter that way anyway).  A count of 0
 * is a no-op.
 *
 * Reductions (SUM, AVG) work on COMM_F32 and COMM_BF16; COMM_BYTE can only be gathered or
 * broadcast.  bf16 is accumulated in fp32 and rounded (to nearest even) once, at the end;
 * AVG is the fp32 sum divided by the world size.  The reduction order is fixed for a given
 * world size, so the same inputs give the same bits on every run.
 *
 * Errors: every call returns 0, or -1 with `err` naming the collective, the peer rank and
 * the cause ("all_reduce: rank 1 closed the connection", "reduce_scatter: timed out after
 * 30 s waiting for rank 2").  No call waits longer than the timeout (comm_options.timeout_s
 * per collective).  After any error -- a bad argument included -- or comm_abort(), the
 * communicator is dead: its connections are shut down, which makes the peers fail at once
 * instead of waiting for their own timeout, and every later call fails immediately.
 * The only way on is comm_destroy() and a new communicator.
 *
 * Threads: one thread at a time makes the collective calls; comm_abort() may be called
 * from any thread at any time before comm_destroy() (a watchdog's way out).
 *
 * Progress (comm_options.progress, for the hung-rank locator): each call publishes its
 * sequence number, collective and the caller's unit label (comm_set_unit) as it starts, and
 * the highest sequence number seen complete (a plain call's return, comm_wait; on NCCL both
 * wait for the collective's CUDA event, so "finished" is the device's).
 *
 * Fault point comm_stall=RANK:CALL:SECONDS (base/fault.h): that rank
 * sleeps SECONDS before its CALL-th collective (which it has not started: its progress says
 * the one before), so that the others time out. */
#ifndef FSDP_COMM_H
#define FSDP_COMM_H

#include <stddef.h>

#include "base/errbuf.h"
#include "worker/comm_types.h" /* comm, comm_dtype, comm_op, comm_options, the sizes */

/* The label the next collectives carry in comm_progress (FSDP: the unit; -1: none). */
void comm_set_unit(comm *c, int unit);
/* "all_gather", ... for a comm_coll. */
const char *comm_coll_name(int op);

/* Every rank's listener address, as reported by comm_tcp_listen() and relayed by the daemons. */
typedef struct comm_rank_table {
    int world;
    const char **addr; /* addr[r]: "host:port" or "[v6addr]:port" of rank r */
} comm_rank_table;

typedef struct comm_listener {
    int fd;                   /* -1 once closed */
    char addr[COMM_ADDR_MAX]; /* "host:port" to publish, numeric */
} comm_listener;

/* Binds a TCP listener on an ephemeral port of bind_host (an address or name of this node
 * that the peers can reach; a wildcard such as 0.0.0.0 is refused, since it cannot be
 * published) and fills l->addr. */
int comm_tcp_listen(comm_listener *l, const char *bind_host, errbuf *err);
/* Closes the listener (no-op when already closed). */
void comm_listener_close(comm_listener *l);

/* CPU backend: connects rank `rank` into the ring described by `table` (it connects to
 * rank+1 and accepts rank-1 on its listener, retrying refused connections until
 * opt->init_timeout_s), with a handshake that proves the secret (challenge and response),
 * then checks the world size and both rank numbers both ways.  Strangers connecting to the listener are turned away without
 * disturbing the setup.  `l` is this rank's listener (may be NULL when world is 1); it is
 * closed on return, success or not. */
int comm_init(comm **out, const comm_options *opt, int rank, const comm_rank_table *table,
              comm_listener *l, errbuf *err);

/* CPU backend: a new communicator of the ranks of `parent` that pass the same color, ranked
 * in the parent's rank order (collective over parent: every rank calls it, with its color).
 * Each rank listens on bind_host anew and the addresses are all-gathered over parent; the
 * handshake is comm_init's (opt: the secret, the timeouts, the progress to publish).
 * hybrid_shard's shard group (a node's ranks) and replica group (one local rank of every
 * node).  comm_nccl_split is the GPU backend's. */
int comm_tcp_split(comm *parent, const comm_options *opt, const char *bind_host, int color,
                   comm **out, errbuf *err);

/* The collectives started on c so far (its sequence number), every kind; 0 for NULL. */
unsigned long long comm_calls(const comm *c);

/* The bytes this rank has sent into all-gathers on c so far (each call's count times its
 * dtype's size: what it contributes; the ring carries world - 1 times that a rank); 0 for NULL. */
unsigned long long comm_gathered_bytes(const comm *c);

/* The seconds this rank has spent in collectives on c so far; 0 for NULL.  On the host
 * backends the time it was blocked in comm calls; on NCCL the collectives' time on the
 * device (events around each: from when its stream reached it to its end).  A rank that
 * others wait for spends the least time in them: the stragglers' watch (daemon/straggler.h). */
double comm_busy_s(const comm *c);

/* Makes *c (a host-memory backend such as TCP) accept buffers in ctx's memory (device
 * memory on CUDA): each collective copies its input to pinned host memory, runs there and
 * copies the result back, synchronously.  For several workers sharing one GPU, where NCCL
 * refuses two ranks per device.  On success *c is the wrapper, which owns the original; on
 * failure *c is left as it was. */
typedef struct kctx kctx;
int comm_stage_through_host(comm **c, kctx *ctx, errbuf *err);

int comm_rank(const comm *c);
int comm_world(const comm *c);
size_t comm_dtype_size(comm_dtype dt); /* 4, 2, 1; 0 for an unknown dtype */

/* recv[r*count .. (r+1)*count) = rank r's send.  In place when send == recv + rank*count;
 * otherwise the buffers must not overlap. */
int comm_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                    errbuf *err);
/* recv = op over all ranks of send[rank*count .. (rank+1)*count).  In place when
 * recv == send + rank*count; otherwise the buffers must not overlap. */
int comm_reduce_scatter(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                        comm_op op, errbuf *err);
/* buf = op over all ranks of buf, in place; every rank ends with the same bits. */
int comm_all_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, errbuf *err);
/* buf = root's buf on every rank. */
int comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root, errbuf *err);
/* Split-phase collectives, to overlap communication with compute (worker/fsdp.c).
 *
 * A *_start call queues the collective behind the compute already queued in the kernels
 * context (its input's producer) and returns a ticket at once; comm_wait(c, t) returns
 * once that collective, and every collective started before it, has finished -- or fails
 * after comm_options.timeout_s from the call -- and the compute queued after comm_wait
 * reads the results.  Until comm_wait, the buffers belong to the collective: neither the
 * host nor newly queued compute may touch them.  Tickets grow with every collective
 * (plain calls included), and a plain call finishes every collective started before it.
 * Backends with no queue of their own (TCP, staged) run the collective inside *_start;
 * comm_wait is then immediate.  Errors are reported as by the plain calls, by _start or
 * by comm_wait. */
typedef unsigned long long comm_ticket;
int comm_all_gather_start(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                          comm_ticket *t, errbuf *err);
int comm_reduce_scatter_start(comm *c, const void *send, void *recv, size_t count,
                              comm_dtype dt, comm_op op, comm_ticket *t, errbuf *err);
int comm_all_reduce_start(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                          comm_ticket *t, errbuf *err);
int comm_wait(comm *c, comm_ticket t, errbuf *err);

/* Returns once every rank has entered the barrier. */
int comm_barrier(comm *c, errbuf *err);

/* Kills the communicator: shuts its connections down (waking the peers and a collective in
 * progress on another thread, which then fail).  Thread-safe; frees nothing. */
void comm_abort(comm *c);
/* Closes every connection and frees the communicator (NULL is fine).  Not concurrent with
 * a collective: abort first, let that call return, then destroy. */
void comm_destroy(comm *c);

#endif
