/* log: fsdpd's one line per event (time, node, rank, what); see log.h. */
#include "daemon/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static int log_node;

void log_set_node(int node) { log_node = node; }

void log_event(int rank, const char *fmt, ...) {
    int node = log_node;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    char who[32];
    if (rank >= 0) snprintf(who, sizeof who, "node %d rank %d", node, rank);
    else snprintf(who, sizeof who, "node %d", node);
    char what[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s.%03dZ fsdpd %s: %s\n", when, (int)(tv.tv_usec / 1000), who, what);
}
