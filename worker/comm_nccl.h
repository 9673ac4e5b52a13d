/* comm_nccl: the NCCL backend of comm.h (CUDA builds only).  Global rank 0 makes the unique
 * id, fsdpd relays it to every rank (NCCL_ID message), each rank joins with it. */
#ifndef FSDP_COMM_NCCL_H
#define FSDP_COMM_NCCL_H

#include "kernels/kernels.h"
#include "worker/comm.h"

#define COMM_NCCL_ID_BYTES MSG_NCCL_ID_BYTES

int comm_nccl_make_id(unsigned char id[COMM_NCCL_ID_BYTES], errbuf *err);
/* Joins rank `rank` of `world` on ctx's device; collectives run on ctx's stream with
 * buffers in its memory.  opt->init_timeout_s bounds the set-up, opt->timeout_s each
 * collective (past it the communicator is aborted). */
int comm_nccl_init(comm **out, const comm_options *opt, int rank, int world,
                   const unsigned char id[COMM_NCCL_ID_BYTES], kctx *ctx, errbuf *err);

/* comm_tcp_split's GPU form (ncclCommSplit): the ranks of parent (an NCCL communicator)
 * passing the same color, in parent's rank order; this rank is `rank` of their `world` (the
 * caller knows both: hybrid_shard's groups are regular).  The new communicator queues on
 * parent's stream, so collectives on the two run in the order they were started; parent
 * must outlive it. */
int comm_nccl_split(comm *parent, const comm_options *opt, int color, int rank, int world,
                    kctx *ctx, comm **out, errbuf *err);

#endif
