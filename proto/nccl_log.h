/* nccl_log: the network transport NCCL chose, read from its INFO lines (NCCL has no API for
 * it).  NCCL logs "Using network NAME" (IB, Socket, Libfabric, AWS Libfabric, ...) once a
 * communicator has picked its net; older and plugin logs say "NET/IB", "NET/OFI" or
 * "NET/Socket" instead.  The last "Using network" wins; without one, the last NET/ tag. */
#ifndef FSDP_NCCL_LOG_H
#define FSDP_NCCL_LOG_H

#include <stddef.h>

/* Writes the transport into out ("IB", "Socket", "Libfabric", "OFI", ...); returns 1 when
 * found, 0 when the text says nothing of it (out = ""). */
int nccl_log_transport(const char *text, size_t len, char *out, size_t n);
/* Whether a transport name is NCCL's TCP sockets. */
int nccl_transport_is_socket(const char *name);

#endif
