/* log: fsdpd's event log — one line per event on stderr: time, node, rank, what. */
#ifndef FSDP_LOG_H
#define FSDP_LOG_H

/* The node index every line names (0 until set: one node, or before the nodes join). */
void log_set_node(int node);
/* rank < 0 for events of the daemon itself. */
void log_event(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
