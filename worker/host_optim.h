/* host_optim: the optimizer step of fsdp.cpu_offload, AdamW on the host (DESIGN.md, LoRA and
 * QLoRA: CPU offload).
 *
 * A pool of threads works through a step's tasks, each a range of one unit's shards, handed
 * out in unit order: unit u is ready as soon as its own tasks are done.  The next step's
 * forward needs unit 0 first, so it starts while the later units are still being updated
 * (host_optim_wait per unit), and the step's AdamW runs beside the GPU's compute.  Each task
 * runs the CPU backend's k_adamw (the reference: so a CPU job gives the same bits with
 * offload on and off) and then refreshes the unit's compute-dtype copy of the range, the
 * values the GPU gathers (bf16 rounded to nearest even, as k_f32_to_compute). */
#ifndef FSDP_HOST_OPTIM_H
#define FSDP_HOST_OPTIM_H

#include <stddef.h>

#include "base/errbuf.h"
#include "kernels/kernels.h"

typedef struct host_optim host_optim;

/* A range of one unit's shards: n elements of each, in host memory. */
typedef struct host_optim_task {
    int unit;
    float *master, *m, *v;
    const float *grad;
    void *param; /* the compute-dtype copy of master to refresh (compute: its dtype) */
    size_t n;
    int decay; /* weight decay applies (not to norm weights) */
} host_optim_task;

typedef struct host_optim_step {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int step; /* counts from 1 */
} host_optim_step;

/* Ranges larger than this are cut into tasks of this many elements (load balance). */
#define HOST_OPTIM_TASK_ELEMS ((size_t)1 << 20)

/* threads: the pool's size (0: one a core); n_units: how many units the tasks name. */
int host_optim_init(host_optim **out, int threads, int n_units, k_dtype compute, errbuf *err);
/* Starts tasks[0..n) (sorted by unit; they must stay valid until host_optim_wait_all) and
 * returns at once.  A step must not start before the previous one is waited for. */
int host_optim_start(host_optim *o, const host_optim_task *tasks, int n, const host_optim_step *s,
                     errbuf *err);
/* Returns once every task of unit u of the step in progress is done (at once when none is). */
int host_optim_wait(host_optim *o, int unit, errbuf *err);
/* Returns once the whole step is done; 0, or -1 with the first task's failure. */
int host_optim_wait_all(host_optim *o, errbuf *err);
/* Waits for the step in progress, stops the threads and frees (NULL is fine). */
void host_optim_destroy(host_optim *o);

/* dst[n] (compute dtype) = src[n]: what a task does to refresh the compute copy. */
void host_optim_cast(k_dtype compute, void *dst, const float *src, size_t n);

#endif
