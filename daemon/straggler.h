/* straggler: the ranks that hold the others back (F48).  In synchronous data parallelism
 * every rank's step lasts as long as the slowest's: the others wait for it in their
 * collectives.  So a rank is compared with the others by its own time — its step less its
 * time in collectives (worker/comm.h, comm_busy_s: host-blocked on the CPU backends, device
 * time on NCCL) — and, apart, by its time in collectives:
 *
 *   own = (step - collectives) per step, of it `data` (filling the batch) and compute (the rest)
 *   slow: own > runtime.straggler_factor x the other ranks' median own time, by more than
 *         5% of their median step (noise of fast steps names nobody); or, when no rank is slow
 *         so (the others' waits are then nobody's doing), its collectives' time above factor
 *         x the others' median by as much (phase "collective": a rank whose transfers are
 *         slow, its link).  The others' median, not all ranks': with two ranks the median
 *         of both is their mean, which a slow one drags up to itself.
 *   a straggler: slow over runtime.straggler_steps steps in a row; named once (until it is
 *         not slow again), with the phase whose excess over its median is the largest
 *         (compute, data or collective).
 *
 * Input, at every look (the leader's heartbeat check): the status rank rows ({"rank", "node",
 * "timing": {"steps", "step_s", "comm_s", "data_s"}}, msg_timing's sums from each rank's
 * heartbeats, followers' from their NODE_HEARTBEATs).  The figures are differences from the
 * rank's previous look, so a rank is judged on the steps since; counts that go back (a new
 * run) start it again. */
#ifndef FSDP_STRAGGLER_H
#define FSDP_STRAGGLER_H

#include <jansson.h>

typedef struct straggler_watch straggler_watch;

/* factor > 1, steps >= 1; NULL when out of memory. */
straggler_watch *straggler_watch_new(double factor, int steps);
void straggler_watch_free(straggler_watch *w);

/* One look at every rank's row.  Returns a new array of strings, what changed: a rank named
 * ("rank 5 on node 2 is a straggler: 0.412 s a step of its own (compute 0.410 s, data
 * 0.002 s) against the other ranks' median 0.101 s, 0.530 s a step in all, for 12 steps
 * (runtime.straggler_factor 1.5): phase compute"), or no longer one; NULL when out of memory. */
json_t *straggler_watch_look(straggler_watch *w, const json_t *ranks);

/* The ranks named now, for the status: [{"rank", "node", "phase", "own_s", "median_own_s",
 * "comm_s", "median_comm_s", "step_s", "steps"}] (a new array). */
json_t *straggler_watch_status(const straggler_watch *w);

#endif
