/* log: fsdpd's event log — one line per event on stderr: time, node, rank, what. */
#ifndef FSDP_LOG_H
#define FSDP_LOG_H

/* rank < 0 for events of the daemon itself. */
void log_event(int node, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
