/* kctx: the context's failure record and dtype size (kctx.h). */
#include "kernels/kctx.h"

#include <stdarg.h>
#include <stdio.h>

size_t k_compute_size(const kctx *c) {
    return c->compute == K_BF16 ? 2 : 4;
}

void k_fail(kctx *c, const char *fmt, ...) {
    if (c->failed) return; /* the first failure is the one worth reporting */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
    c->failed = 1;
}

int k_check(kctx *c, errbuf *err) {
    if (!c->failed) return 0;
    c->failed = 0;
    return errf(err, "%s", c->failure);
}
