/* comm_backend: what a comm backend (comm_tcp.c, comm_nccl.c, comm_staged.c) implements behind
 * comm.h.  Private to the comm_* files.
 *
 * comm.c checks the arguments and the communicator's state, runs the comm_stall fault, sets the
 * deadline of the collective, then calls the backend.  A backend returns -1 with the cause
 * only ("rank 2 closed the connection"); comm.c prefixes the collective's name, marks the
 * communicator dead and calls ops->abort so that the peers learn at once. */
#ifndef FSDP_COMM_BACKEND_H
#define FSDP_COMM_BACKEND_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "worker/comm_types.h" /* not comm.h: comm.c includes this file */

typedef struct comm_ops {
    int (*all_gather)(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                      errbuf *err);
    int (*reduce_scatter)(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                          comm_op op, errbuf *err);
    int (*all_reduce)(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, errbuf *err);
    int (*broadcast)(comm *c, void *buf, size_t count, comm_dtype dt, int root, errbuf *err);
    int (*barrier)(comm *c, errbuf *err);
    /* Optional split phase (comm.h): queue the collective numbered c->ncalls and return;
     * wait until collective number t has finished.  A backend without them runs the
     * plain call inside *_start. */
    int (*all_gather_start)(comm *c, const void *send, void *recv, size_t count,
                            comm_dtype dt, errbuf *err);
    int (*reduce_scatter_start)(comm *c, const void *send, void *recv, size_t count,
                                comm_dtype dt, comm_op op, errbuf *err);
    int (*all_reduce_start)(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                            errbuf *err);
    int (*wait)(comm *c, uint64_t t, errbuf *err);
    void (*abort)(comm *c);   /* thread-safe: shut connections down, free nothing */
    void (*destroy)(comm *c); /* close and free everything, the comm included */
} comm_ops;

/* The common part; a backend's struct starts with it. */
struct comm {
    const comm_ops *ops;
    int rank, world;
    double timeout_s;
    double deadline;  /* clock_now_s() by which the collective in progress must end */
    atomic_int aborted;
    int dead;
    char dead_reason[sizeof(errbuf)]; /* the error that killed it */
    uint64_t ncalls;  /* collectives started */
    uint64_t gathered_bytes; /* what this rank has contributed to all-gathers (comm_gathered_bytes) */
    comm_progress *progress; /* comm_options.progress */
    int unit;         /* comm_set_unit */
    /* comm_busy_s: the seconds this rank spent in collectives.  comm.c adds the host's time in
     * each call unless device_timed: the backend adds its collectives' device time itself. */
    double busy_s;
    int device_timed;
};

/* Fills the common part (checks the options). */
int comm_setup(comm *c, const comm_ops *ops, int rank, int world, const comm_options *opt,
               errbuf *err);

#endif
