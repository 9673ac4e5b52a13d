/* errbuf: error messages written, prefixed and carried up; see errbuf.h. */
#include "base/errbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int errf(errbuf *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int errprefix(errbuf *e, const char *fmt, ...) {
    if (!e) return -1;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    size_t plen = strlen(prefix) + 2; /* "prefix: " */
    size_t cap = sizeof e->msg - 1;
    if (plen >= cap) plen = cap;
    size_t keep = strnlen(e->msg, cap);
    if (keep > cap - plen) keep = cap - plen;
    memmove(e->msg + plen, e->msg, keep);
    memcpy(e->msg, prefix, plen - 2);
    memcpy(e->msg + plen - 2, ": ", 2);
    e->msg[plen + keep] = '\0';
    return -1;
}
