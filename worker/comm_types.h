/* comm_types: the types that comm.h (the collectives' API) and comm_backend.h (what a backend
 * implements) both need, in a header of their own so that neither includes the other: comm.c
 * includes comm_backend.h, and a backend includes comm.h only for the API it calls.
 * comm.h says what they mean. */
#ifndef FSDP_COMM_TYPES_H
#define FSDP_COMM_TYPES_H

#include <stdatomic.h>

#include "proto/msg.h"

#define COMM_SECRET_BYTES MSG_SECRET_BYTES /* the sizes both ends agree on live in proto/msg.h */
#define COMM_ADDR_MAX MSG_ADDR_MAX
#define COMM_MAX_WORLD 65536

typedef enum comm_dtype { COMM_F32, COMM_BF16, COMM_BYTE } comm_dtype;
typedef enum comm_op { COMM_SUM, COMM_AVG } comm_op;

typedef struct comm comm;

/* The collectives a communicator has started and finished, for the hung-rank locator: the
 * worker owns it and its heartbeat thread reads it while the training thread calls. */
typedef enum comm_coll { COMM_COLL_ALL_GATHER, COMM_COLL_REDUCE_SCATTER, COMM_COLL_ALL_REDUCE,
                         COMM_COLL_BROADCAST, COMM_COLL_BARRIER } comm_coll;
typedef struct comm_progress {
    atomic_ullong started;  /* sequence number (from 1) of the last collective started */
    atomic_ullong finished; /* the highest one the host saw complete */
    atomic_int op;          /* comm_coll of the last started */
    atomic_int unit;        /* its caller's label (comm_set_unit; FSDP: the unit), -1 none */
} comm_progress;

typedef struct comm_options {
    /* The job secret: a connection whose peer cannot prove it (base/auth.h challenge and
     * response; the secret never travels) is refused.  Nothing is encrypted: it keeps other
     * jobs and stray clients out, not an eavesdropper. */
    unsigned char secret[COMM_SECRET_BYTES];
    double timeout_s;      /* deadline of each collective (runtime.comm_timeout_s); > 0 */
    double init_timeout_s; /* deadline for comm_init to connect to its peers; > 0 */
    comm_progress *progress; /* NULL: not tracked */
} comm_options;

#endif
