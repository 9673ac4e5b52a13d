/* plot: a job's metrics file (runtime.metrics) drawn as an SVG: loss, learning rate,
 * tokens/s and the eval loss over the steps, resumes, restarts and requeues as dashed vertical
 * lines (plot.c's top comment has the details).  `fsdpctl plot` and the output's model card
 * (daemon/model_card.h) draw with it. */
#ifndef FSDP_DAEMON_PLOT_H
#define FSDP_DAEMON_PLOT_H

#include <stddef.h>

#include "base/errbuf.h"

typedef struct plot_result {
    size_t steps;      /* the steps drawn */
    long first, last;  /* the first and last of them */
    int markers;       /* runs marked (resumes, restarts, requeues) */
} plot_result;

/* Reads metrics and writes out (atomically); a file with no step is an error.  r may be NULL. */
int plot_metrics(const char *metrics, const char *out, plot_result *r, errbuf *err);

#endif
