/* locator: which ranks a hung collective waits for (F23).  Every rank publishes the last
 * collective it started (sequence number, collective, FSDP unit) and the last it finished
 * (worker/comm.h, comm_progress), in its heartbeats; when a collective times out, the
 * ranks that never started the one the others are in are the ones behind.
 *
 * Input: status rank rows ({"rank", "node", "coll": {"started", "finished", "op", "unit"},
 * "coll_still_s": seconds its figures have not moved}) and, for the hosts, the status's
 * nodes ({"node", "host"}; may be NULL).  A rank whose figures moved within settle_s is not
 * hung: then nothing is reported (the figures of a job that still moves say nothing).
 * Returns a new array of strings, one a rank behind ("rank 13 on node 2 (10.0.0.3) never
 * started all_gather #4821 of unit 17; its last was reduce_scatter #4820"), or, when every
 * rank started it, the ranks that did not finish it; empty when nothing can be said. */
#ifndef FSDP_LOCATOR_H
#define FSDP_LOCATOR_H

#include <jansson.h>

json_t *locator_find(const json_t *ranks, const json_t *nodes, double settle_s);

#endif
