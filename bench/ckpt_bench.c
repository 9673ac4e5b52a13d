/* ckpt_bench: how fast a rank saves its checkpoint shard, and how long training stalls for an
 * async save.  Built and run by bench/ckpt_bench.sh.
 *
 * usage: ckpt_bench DIR [GB]
 *
 * One rank (CPU backend) holds a Llama whose fp32 master + AdamW m and v come to about GB
 * gigabytes (default 1).  Five rounds of: `dd if=/dev/zero bs=1M count=1024 conv=fsync` into
 * DIR, a sync save and an async save of that state through worker/ckpt_writer into DIR.  For
 * each save: the staging time (the copy to host memory; for an async save the only time the
 * training thread is held), the write time (CRC32C + write + fsync of the shard file) and its
 * throughput; at the end the medians.  During each async write the
 * training thread keeps computing (a linear layer through kernels.h, one BLAS thread as in a
 * worker) and the bench reports its rate against the rate with no write in flight. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "worker/ckpt_writer.h"
#include "worker/fsdp.h"

static ckpt_report last;

static void on_report(void *arg, const ckpt_report *r) {
    (void)arg;
    last = *r;
}

/* Stand-in for training compute: a 256 x 256 x 256 linear layer through the kernels. */
enum { GEMM_N = 256 };
static kctx *compute_ctx;
static float *ga, *gb, *gc;
static void compute_unit(void) {
    k_linear_fwd(compute_ctx, gc, ga, gb, GEMM_N, GEMM_N, GEMM_N);
}

static double compute_rate(double seconds) {
    double t0 = clock_now_s();
    long n = 0;
    while (clock_now_s() - t0 < seconds) compute_unit(), n++;
    return (double)n / (clock_now_s() - t0);
}

/* A model of hidden 1024 whose layer count makes 12 bytes per parameter come to ~gb GB. */
static llama_config bench_model(double gigabytes) {
    llama_config c = {.hidden_size = 1024, .intermediate_size = 2816, .num_attention_heads = 16,
                      .num_key_value_heads = 16, .head_dim = 64, .vocab_size = 16000,
                      .max_position_embeddings = 2048, .rms_norm_eps = 1e-5,
                      .initializer_range = 0.02, .bos_token_id = 1, .eos_token_id = 2,
                      .rope = {.type = ROPE_DEFAULT, .theta = 10000.0}};
    double per_layer = 4.0 * 1024 * 1024 + 3.0 * 1024 * 2816 + 2 * 1024;
    double fixed = 2.0 * 16000 * 1024 + 1024;
    int layers = (int)((gigabytes * 1e9 / 12.0 - fixed) / per_layer + 0.5);
    c.num_hidden_layers = layers < 1 ? 1 : layers;
    return c;
}

enum { ROUNDS = 5 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v) {
    double s[ROUNDS];
    memcpy(s, v, sizeof s);
    qsort(s, ROUNDS, sizeof *s, cmp_double);
    return s[ROUNDS / 2];
}

/* One save; an async one while the training stand-in computes.  *held is how long the
 * caller was held, *rate the stand-in's rate while the writer ran. */
static int save(ckpt_writer *w, fsdp *f, int64_t step, int sync, double *held, double *rate) {
    errbuf err;
    double t0 = clock_now_s();
    if (ckpt_writer_save(w, f, step, 1, sync, 0, &err)) {
        fprintf(stderr, "ckpt_bench: %s\n", err.msg);
        return -1;
    }
    *held = clock_now_s() - t0;
    long n = 0;
    while (ckpt_writer_busy(w)) compute_unit(), n++;
    if (!sync) *rate = (double)n / (clock_now_s() - t0 - *held);
    if (!last.ok) {
        fprintf(stderr, "ckpt_bench: save failed: %s\n", last.error);
        return -1;
    }
    return 0;
}

static void remove_save(const char *dir, int64_t step) {
    char name[64], path[8192];
    ckpt_partial_name(name, sizeof name, step, 1);
    snprintf(path, sizeof path, "%s/%s/rank-00000-of-00001.bin", dir, name);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    rmdir(path);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ckpt_bench DIR [GB]\n");
        return 2;
    }
    const char *dir = argv[1];
    llama_config cfg = bench_model(argc > 2 ? atof(argv[2]) : 1.0);
    errbuf err;
    kctx ctx;
    fsdp f;
    ckpt_writer w;
    fsdp_options opt = {.sharding = JOB_SHARD_FULL};
    ckpt_writer_options wopt = {.dir = dir, .rank = 0, .timeout_s = 600, .report = on_report};
    if (kctx_init(&ctx, K_CPU, 0, &err) || fsdp_init(&f, &cfg, &ctx, NULL, 0, 1, &opt, &err) ||
        fsdp_init_random(&f, 1, &err) || ckpt_writer_init(&w, &wopt, &err) ||
        ckpt_writer_prepare(&w, &f, &err)) {
        fprintf(stderr, "ckpt_bench: %s\n", err.msg);
        return 1;
    }
    for (int u = 0; u < f.layout.n_units; u++) { /* m and v: not zeros */
        memcpy(f.units[u].m, f.units[u].master, f.units[u].shard * sizeof(float));
        memcpy(f.units[u].v, f.units[u].master, f.units[u].shard * sizeof(float));
    }
    compute_ctx = &ctx;
    ga = k_alloc(&ctx, 3 * GEMM_N * GEMM_N * sizeof(float), &err);
    if (!ga) {
        fprintf(stderr, "ckpt_bench: %s\n", err.msg);
        return 1;
    }
    gb = ga + GEMM_N * GEMM_N;
    gc = gb + GEMM_N * GEMM_N;
    for (int i = 0; i < 2 * GEMM_N * GEMM_N; i++) ga[i] = (float)(i % 7) * 0.1f;

    uint64_t params = 0;
    for (int u = 0; u < f.layout.n_units; u++) params += f.units[u].numel;
    printf("state: %d layers, %.1f M parameters, %.3f GB (fp32 master + m + v)\n",
           cfg.num_hidden_layers, (double)params / 1e6, 12.0 * (double)params / 1e9);
    double base_rate = compute_rate(1.0);
    printf("training stand-in: %.1f linear layers/s with no save in flight\n", base_rate);

    /* Rounds of: dd, a sync save, an async save — interleaved, as the disk's speed drifts. */
    double dd_gbps[ROUNDS], sync_gbps[ROUNDS], async_gbps[ROUNDS], stall[ROUNDS], slow[ROUNDS];
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of='%s/dd.bin' bs=1M count=1024 conv=fsync 2>/dev/null", dir);
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = clock_now_s();
        if (system(cmd) != 0) {
            fprintf(stderr, "ckpt_bench: %s failed\n", cmd);
            return 1;
        }
        dd_gbps[round] = 1073741824.0 / (clock_now_s() - t0) / 1e9;
        snprintf(cmd + 8000, 300, "%s/dd.bin", dir);
        unlink(cmd + 8000);
        for (int sync = 1; sync >= 0; sync--) {
            int64_t step = 2 * round + 2 - sync;
            double rate = 0, held;
            if (save(&w, &f, step, sync, &held, &rate)) return 1;
            double gbps = (double)last.bytes / last.write_s / 1e9;
            printf("round %d %s save: %.3f GB, staged in %.3f s, written in %.3f s = %.2f GB/s, training "
                   "held %.3f s", round + 1, sync ? "sync " : "async", (double)last.bytes / 1e9,
                   last.stage_s, last.write_s, gbps, held);
            if (sync) {
                sync_gbps[round] = gbps;
                printf(" (dd: %.2f GB/s)\n", dd_gbps[round]);
            } else {
                async_gbps[round] = gbps;
                stall[round] = held;
                slow[round] = 1.0 - rate / base_rate;
                printf(", compute during the write at %.0f%% of its rate\n", 100.0 * rate / base_rate);
            }
            remove_save(dir, step);
        }
    }
    printf("median of %d: dd %.3f GB/s; sync save %.3f GB/s (%.0f%% of dd); async save %.3f GB/s, "
           "training held %.3f s, compute slowed by %.0f%% while it wrote\n", ROUNDS, median(dd_gbps),
           median(sync_gbps), 100.0 * median(sync_gbps) / median(dd_gbps), median(async_gbps),
           median(stall), 100.0 * median(slow));
    ckpt_writer_destroy(&w, 0);
    k_free(&ctx, ga);
    fsdp_destroy(&f);
    kctx_destroy(&ctx);
    return 0;
}
