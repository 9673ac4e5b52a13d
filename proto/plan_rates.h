/* plan_rates: the rates table `fsdpctl plan` and fsdpd predict step times from (F32): what
 * bench/plan_rates.c measured on one GPU (configs/plan/h200.json), as a typed struct with a
 * strict decoder.
 *
 *   {
 *     "format": "fsdpd-plan-rates/1",
 *     "gpu": "h200",                      one of the GPUs of plan_gpus (model/step_plan.h)
 *     "device": "NVIDIA H200",            the CUDA device name it ran on (informative)
 *     "context_bytes": 590151680,         device memory a CUDA context with its workspace holds
 *     "elementwise_gbps": 3291.9,         memory-bound ops (GB/s of bytes read and written)
 *     "dequant_gbps": 2224.8,             NF4 dequantization (bytes of codes, absmax, output)
 *     "cross_entropy_gbps": 2124.8,       cross entropy (logits read and written)
 *     "adamw_gbps": 3844.9,               AdamW on fp32 shards (28 bytes an element)
 *     "h2d_gbps": 55.4, "d2h_gbps": 55.4, pinned host memory to and from the device
 *     "registered_h2d_gbps": 25.0,        read-only registered host memory to the device on the
 *                                         copy stream (what fsdp.offload_params streams from)
 *     "launch_us": 0.87,                  one kernel launch
 *     "host_adamw_gelems": 1.604,         the CPU backend's AdamW on every core (1e9 elements/s)
 *     "disk_gbps": 1.472,                 writing and fsync-ing a file (the checkpoint's disk)
 *     "gemm": [[N, I, O, fwd_ms, dx_ms, dw_ms], ...],
 *         out[N,O] = in[N,I] W[O,I]^T in bf16 with fp32 accumulation: the forward, the input
 *         gradient (dout W) and the weight gradient (dout^T in, accumulated in fp32)
 *     "attention": [[B, T, Hq, Hkv, hd, fwd_ms, bwd_ms], ...]   causal, unpacked
 *   }
 *
 * Every key is required and no other is allowed; numbers are finite and positive (the
 * shapes' dimensions positive integers below 2^31, Hq a multiple of Hkv); each table has at
 * least one row and at most PLAN_RATES_MAX_ROWS. */
#ifndef FSDP_PLAN_RATES_H
#define FSDP_PLAN_RATES_H

#include <stddef.h>

#include "base/errbuf.h"

#define PLAN_RATES_FORMAT "fsdpd-plan-rates/1"
#define PLAN_RATES_MAX_ROWS 4096
#define PLAN_RATES_NAME_MAX 64

typedef struct plan_gemm_rate {
    int N, I, O;
    double fwd_ms, dx_ms, dw_ms;
} plan_gemm_rate;

typedef struct plan_attention_rate {
    int B, T, Hq, Hkv, hd;
    double fwd_ms, bwd_ms;
} plan_attention_rate;

typedef struct plan_rates {
    char gpu[PLAN_RATES_NAME_MAX], device[PLAN_RATES_NAME_MAX];
    double context_bytes;
    double elementwise_gbps, dequant_gbps, cross_entropy_gbps, adamw_gbps, h2d_gbps, d2h_gbps;
    double registered_h2d_gbps;
    double launch_us, host_adamw_gelems, disk_gbps;
    plan_gemm_rate *gemm; /* [n_gemm], owned */
    int n_gemm;
    plan_attention_rate *attention; /* [n_attention], owned */
    int n_attention;
} plan_rates;

/* Decodes a table of len bytes (name: for messages, e.g. the file's path). */
int plan_rates_parse(plan_rates *r, const char *text, size_t len, const char *name, errbuf *err);
/* Reads and decodes the file at path. */
int plan_rates_load(plan_rates *r, const char *path, errbuf *err);
void plan_rates_free(plan_rates *r);

#endif
