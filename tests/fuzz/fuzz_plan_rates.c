/* libFuzzer target for plan_rates_parse (the rates table of `fsdpctl plan`): any input must be
 * rejected with a message leaving nothing allocated, or give a table whose every value keeps
 * the header's promises (finite positive numbers, positive shapes, Hq a multiple of Hkv,
 * 1..PLAN_RATES_MAX_ROWS rows, NUL-terminated names). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/plan_rates.h"

static int positive(double x) { return x > 0 && isfinite(x); }

static int name_ok(const char *s) {
    size_t n = strnlen(s, PLAN_RATES_NAME_MAX);
    return n > 0 && n < PLAN_RATES_NAME_MAX;
}

static int scalars_ok(const plan_rates *r) {
    const double v[] = {r->context_bytes, r->elementwise_gbps, r->dequant_gbps,
                        r->cross_entropy_gbps, r->adamw_gbps, r->h2d_gbps, r->d2h_gbps, r->registered_h2d_gbps,
                        r->launch_us, r->host_adamw_gelems, r->disk_gbps};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!positive(v[i])) return 0;
    return name_ok(r->gpu) && name_ok(r->device);
}

static int rows_ok(const plan_rates *r) {
    if (r->n_gemm < 1 || r->n_gemm > PLAN_RATES_MAX_ROWS || r->n_attention < 1 ||
        r->n_attention > PLAN_RATES_MAX_ROWS)
        return 0;
    for (int i = 0; i < r->n_gemm; i++) {
        const plan_gemm_rate *g = &r->gemm[i];
        if (g->N < 1 || g->I < 1 || g->O < 1 || !positive(g->fwd_ms) || !positive(g->dx_ms) ||
            !positive(g->dw_ms))
            return 0;
    }
    for (int i = 0; i < r->n_attention; i++) {
        const plan_attention_rate *a = &r->attention[i];
        if (a->B < 1 || a->T < 1 || a->Hq < 1 || a->Hkv < 1 || a->hd < 1 || a->Hq % a->Hkv ||
            !positive(a->fwd_ms) || !positive(a->bwd_ms))
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    plan_rates r;
    errbuf err = {{0}};
    if (plan_rates_parse(&r, (const char *)data, size, "fuzz.json", &err) < 0) {
        if (!err.msg[0] || r.gemm || r.attention || r.n_gemm || r.n_attention) abort();
        return 0;
    }
    if (!scalars_ok(&r) || !rows_ok(&r)) abort();
    plan_rates_free(&r);
    if (r.gemm || r.attention || r.n_gemm || r.n_attention) abort();
    return 0;
}
