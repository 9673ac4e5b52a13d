/* host_memory: how much memory this node can still give its workers, read before the model
 * loads, so that a job whose pinned host buffers (fsdp.cpu_offload's masters, AdamW state and
 * gradients; fsdp.offload_activations' layer inputs) cannot fit is refused at once, naming the
 * figures, instead of failing in a worker's cudaMallocHost after the load.
 *
 * The figure is the smaller of /proc/meminfo's MemAvailable and, when the process runs in a
 * memory cgroup (SLURM's task/cgroup), its limit less its usage (v2: memory.max -
 * memory.current; v1: memory.limit_in_bytes - memory.usage_in_bytes); *source says
 * which ("MemAvailable" or "the cgroup's memory limit").  Fault point host_memory=BYTES
 * (base/fault.h) stands in for both.  Returns -1 (with err) when neither can be read. */
#ifndef FSDP_HOST_MEMORY_H
#define FSDP_HOST_MEMORY_H

#include <stdint.h>

#include "base/errbuf.h"

int host_memory_available(uint64_t *bytes, const char **source, errbuf *err);

/* Field `field` ("MemAvailable", "VmRSS") of a /proc file of "Name:   N kB" lines, in bytes;
 * -1 when the file or the field cannot be read. */
long long proc_kib_field(const char *path, const char *field);

#endif
