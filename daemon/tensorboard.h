/* tensorboard: runtime.log_to tensorboard — TensorBoard event files (proto/tb_event.h) in
 * OUTPUT_DIR/tensorboard/, written by the leader's supervisor from rank 0's METRICS.
 *
 * One file per run (a start, each restart, each resume or requeue), named as TensorBoard's
 * writers name theirs, events.out.tfevents.TIME.HOST.PID.RESTART, so that every run's file
 * sorts after the one before.  It opens with the file version, a SessionLog START at the run's
 * first step (TensorBoard drops what an earlier file holds from that step on: the steps a
 * restart repeats) and the resolved job as the text summary "job" (a JSON code block); then
 * each step's scalars (daemon/step_scalars.h, as float32), written (no buffering) as the
 * step's METRICS arrives. */
#ifndef FSDP_TENSORBOARD_H
#define FSDP_TENSORBOARD_H

#include <stdint.h>

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/msg.h"

typedef struct tb_writer tb_writer;

/* Makes OUTPUT_DIR/tensorboard and a new event file there for the run of job j starting at
 * first_step (1, or the resumed step + 1) of fsdpd's restart number `restart`; an error (the
 * directory or the file cannot be written) names the path. */
int tb_writer_open(tb_writer **w, const job_config *j, int restart, int64_t first_step, errbuf *err);
/* Appends one step's scalars; -1 when the file cannot be written (the caller logs it). */
int tb_writer_step(tb_writer *w, const msg_metrics *m, errbuf *err);
/* The path of the file (for the log). */
const char *tb_writer_path(const tb_writer *w);
void tb_writer_close(tb_writer *w);

#endif
