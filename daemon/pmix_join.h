/* pmix_join: the rendezvous of the nodes through PMIx, when fsdpd runs under `srun
 * --mpi=pmix` (DESIGN.md, "SLURM, rendezvous, fabric"; daemon/cluster.h).
 *
 * The leader (PMIx rank 0, node 0) puts its address, its port and the job secret under a key
 * named after fsdpd's attempt, commits them and joins a fence of every task of the step; the
 * others join the fence and get them.  So the secret never lies on the shared storage: the
 * rendezvous file in checkpoint.dir then carries it blank, and still carries the nonce every
 * node must read (proof that the directory is shared).  Without PMIx (plain srun, no SLURM)
 * the file carries everything, as before.  One fsdpd per node: the PMIx rank must be the
 * node index.  PMIx is initialised once, at the first exchange, and finalised at exit. */
#ifndef FSDP_PMIX_JOIN_H
#define FSDP_PMIX_JOIN_H

#include "base/errbuf.h"
#include "proto/msg.h"

typedef struct pmix_join_endpoint {
    char host[MSG_ADDR_MAX];
    int port;
    char secret_hex[2 * MSG_SECRET_BYTES + 1];
} pmix_join_endpoint;

/* 1 when this process was started as a PMIx client (PMIX_NAMESPACE is set). */
int pmix_join_active(void);

/* Node 0 (the leader): publishes its address, port and the secret, then the fence.  The
 * fence waits at most timeout_s for every node. */
int pmix_join_lead(const char *host, int port, const char *secret_hex, int attempt, int timeout_s, errbuf *err);
/* Node `node` (> 0): the fence, then *ep is the leader's. */
int pmix_join_follow(pmix_join_endpoint *ep, int node, int attempt, int timeout_s, errbuf *err);

#endif
