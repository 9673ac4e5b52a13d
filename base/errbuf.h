/* errbuf: how every fallible call in fsdpd reports what went wrong.
 *
 * A function that can fail returns 0 on success and -1 on failure, after writing a
 * one-line, human-readable message into the caller's errbuf (naming the file, key or
 * peer involved).  Libraries never print and never exit; the program's top level does. */
#ifndef FSDP_ERRBUF_H
#define FSDP_ERRBUF_H

#include <stddef.h>

typedef struct errbuf {
    char msg[1024];
} errbuf;

/* Formats the message into e (when e is not NULL) and returns -1, so callers can write
 * `return errf(e, "%s: truncated header", path);`. */
int errf(errbuf *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message; returns -1. */
int errprefix(errbuf *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
