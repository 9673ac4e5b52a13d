/* CPU backend: host memory, copies and casts (the compute dtype is fp32, so casts copy). */
#include "kernels/cpu/cpu_kernels.h"

#include <stdlib.h>
#include <string.h>

void *cpu_alloc(kctx *c, size_t bytes, errbuf *err) {
    (void)c;
    /* calloc(0) may return NULL, which would read as a failure. */
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) errf(err, "k_alloc: out of host memory allocating %zu bytes", bytes);
    return p;
}

void cpu_free(kctx *c, void *p) {
    (void)c;
    free(p);
}

/* Host and context memory are the same here, so every copy is one. */
static void copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}

void *cpu_host_alloc(kctx *c, size_t bytes, errbuf *err) { return cpu_alloc(c, bytes, err); }

void cpu_host_free(kctx *c, void *p) { cpu_free(c, p); }

void cpu_copy_h2d(kctx *c, void *dst, const void *host_src, size_t bytes) {
    (void)c;
    copy(dst, host_src, bytes);
}

void cpu_copy_h2d_start(kctx *c, void *dst, const void *host_src, size_t bytes) {
    (void)c;
    copy(dst, host_src, bytes);
}

void cpu_copy_h2d_wait(kctx *c) { (void)c; }

void cpu_host_register(kctx *c, const void *p, size_t bytes) {
    (void)c, (void)p, (void)bytes;
}

void cpu_host_unregister(kctx *c, const void *p) { (void)c, (void)p; }

void cpu_copy_d2h(kctx *c, void *host_dst, const void *src, size_t bytes) {
    (void)c;
    copy(host_dst, src, bytes);
}

void cpu_zero(kctx *c, void *p, size_t bytes) {
    (void)c;
    if (bytes) memset(p, 0, bytes);
}

void cpu_f32_to_compute(kctx *c, void *dst, const float *src, size_t n) {
    (void)c;
    copy(dst, src, n * sizeof(float));
}

void cpu_compute_to_f32(kctx *c, float *dst, const void *src, size_t n) {
    (void)c;
    copy(dst, src, n * sizeof(float));
}
