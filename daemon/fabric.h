/* fabric: what carries NCCL between nodes here, found before the workers start (F23).
 *
 * The probe looks at:
 *   - the RDMA devices of sysfs (ROOT/sys/class/infiniband/NAME): an EFA device (driver
 *     "efa", named rdmap*) or an InfiniBand/RoCE one (any other driver, e.g. mlx5_core),
 *     with its port 1 state;
 *   - libfabric (dlopen ROOT/opt/amazon/efa/lib64/libfabric.so.1, .../lib/..., then the
 *     system's libfabric.so.1): does fi_getinfo list the efa provider?
 *   - the NCCL net plugins that load and export ncclNet_v7..v10: libnccl-net-$NCCL_NET_PLUGIN.so
 *     when the user named one, libnccl-net-ofi.so and libnccl-net.so under
 *     ROOT/opt/amazon/ofi-nccl/lib{64,}, then both on the loader's path.
 * ROOT is "" (the fault point fabric_root=PATH gives tests a fake machine).
 *
 * From what it found, fabric_setenv sets the workers' environment, never a variable the user
 * set, nothing where nothing was found (the README lists each variable and its finding):
 *   plugin found        NCCL_NET_PLUGIN=ofi (for libnccl-net-ofi.so), its directory first in
 *                       LD_LIBRARY_PATH;
 *   EFA found           FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1, FI_EFA_FORK_SAFE=1 (fsdpd
 *                       forks), libfabric's directory in LD_LIBRARY_PATH;
 *   CUDA backend        NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET and NCCL_DEBUG_FILE=
 *                       DIR/nccl-%h-%p.log, unless NCCL_DEBUG is set: the workers read their
 *                       file for the transport NCCL chose (proto/nccl_log.h).
 * It refuses (fabric.require) when EFA is present but no plugin loads: NCCL would fall back
 * to TCP sockets. */
#ifndef FSDP_FABRIC_H
#define FSDP_FABRIC_H

#include "base/errbuf.h"
#include "base/path.h"

#define FABRIC_LIST_MAX 256

typedef struct fabric_found {
    char efa[FABRIC_LIST_MAX];   /* EFA devices, "rdmap16s27 rdmap32s27" ("" none) */
    char ib[FABRIC_LIST_MAX];    /* InfiniBand/RoCE devices with their port state, "mlx5_0(ACTIVE)" */
    int efa_provider;            /* libfabric lists the efa provider */
    char libfabric[PATH_BYTES];  /* the libfabric that loaded ("" none) */
    char plugin[PATH_BYTES];     /* the NCCL net plugin that loaded ("" none) */
    char plugin_name[32];        /* its NCCL_NET_PLUGIN name ("ofi"; "" for libnccl-net.so) */
} fabric_found;

int fabric_probe(fabric_found *f, errbuf *err);
/* "efa", "ib" or "none": what a worker's transport must not fall below. */
const char *fabric_kind(const fabric_found *f);
/* One line of what was found, for the log and status. */
void fabric_describe(const fabric_found *f, char *out, size_t n);
/* Sets the environment (see above; nccl_log_dir "" for the CPU backend), logs each variable
 * set, and refuses as fabric.require says. */
int fabric_setenv(const fabric_found *f, int require, const char *nccl_log_dir, errbuf *err);

#endif
