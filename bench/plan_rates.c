/* plan_rates: measures on this GPU the rates `fsdpctl plan` predicts step times from, and
 * writes them as a rates table (proto/plan_rates.h; configs/plan/h200.json is its H200 run).
 *
 *   plan_rates OUT.json DISK_DIR TOKENS,TOKENS,... MODEL.json...
 *
 * For every model config and micro-batch token count N: each linear's three GEMMs (forward,
 * the input gradient, the weight gradient) at its shape, the head's, the LoRA A and B
 * projections at rank 64 (skinny, memory-bound), and attention forward and backward at
 * B = N / 2048 rows of 2048 tokens (and N / 4096 of 4096 where N allows), and once a model one
 * row of 8192, 16384, 32768 and 65536 tokens (long sequences).  Then the rates of
 * the memory-bound ops (SwiGLU's, as GB/s of bytes moved), NF4 dequantization, cross
 * entropy, AdamW, pinned host copies both ways, the CPU backend's AdamW on every core (the
 * host optimizer of fsdp.cpu_offload), a launch, the memory a CUDA context with its
 * workspace takes, and writing with fsync to DISK_DIR.  Each figure is the median of 7 timed
 * runs after 2 warm-up runs; every line it measures is printed too. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/mman.h>

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "proto/model_config.h"

#define RUNS 7
#define LORA_RANK 64

static kctx gpu;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "plan_rates: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sync_or_die(void) {
    errbuf err = {{0}};
    if (k_sync(&gpu, &err)) die("%s", err.msg);
}

static void *dev(size_t bytes) {
    errbuf err = {{0}};
    void *p = k_alloc(&gpu, bytes ? bytes : 1, &err);
    if (!p) die("%s", err.msg);
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median seconds of fn(arg) over RUNS runs, after 2 warm-up runs. */
typedef void (*op_fn)(void *arg);
static double median_s(op_fn fn, void *arg) {
    double t[RUNS];
    for (int i = 0; i < 2; i++) fn(arg);
    sync_or_die();
    for (int i = 0; i < RUNS; i++) {
        double t0 = now();
        fn(arg);
        sync_or_die();
        t[i] = now() - t0;
    }
    qsort(t, RUNS, sizeof t[0], cmp_double);
    return t[RUNS / 2];
}

/* ---- GEMMs ---- */

typedef struct gemm_case {
    int N, I, O, which; /* 0 forward, 1 input gradient, 2 weight gradient */
    void *in, *w, *out, *din;
    float *dw;
} gemm_case;

static void run_gemm(void *arg) {
    gemm_case *g = arg;
    if (g->which == 0) k_linear_fwd(&gpu, g->out, g->in, g->w, g->N, g->I, g->O);
    else if (g->which == 1) k_linear_bwd(&gpu, g->din, NULL, g->out, g->in, g->w, g->N, g->I, g->O, 0);
    else k_linear_bwd(&gpu, NULL, g->dw, g->out, g->in, g->w, g->N, g->I, g->O, 0);
}

/* Rows of the table: the shapes measured so far (each once). */
#define MAX_ROWS 1024
static int gemm_rows[MAX_ROWS][3], n_gemm;
static double gemm_ms[MAX_ROWS][3];
static int attn_rows[MAX_ROWS][5], n_attn;
static double attn_ms[MAX_ROWS][2];

static void measure_gemm(int N, int I, int O) {
    for (int r = 0; r < n_gemm; r++)
        if (gemm_rows[r][0] == N && gemm_rows[r][1] == I && gemm_rows[r][2] == O) return;
    if (n_gemm == MAX_ROWS) die("too many GEMM shapes");
    size_t cs = k_compute_size(&gpu);
    gemm_case g = {.N = N, .I = I, .O = O};
    g.in = dev((size_t)N * I * cs);
    g.w = dev((size_t)O * I * cs);
    g.out = dev((size_t)N * O * cs);
    g.din = dev((size_t)N * I * cs);
    g.dw = dev((size_t)O * I * sizeof(float));
    double flops = 2.0 * N * (double)I * O;
    for (g.which = 0; g.which < 3; g.which++) gemm_ms[n_gemm][g.which] = 1e3 * median_s(run_gemm, &g);
    printf("gemm N=%d I=%d O=%d: forward %.3f ms (%.0f TFLOP/s), input grad %.3f ms, weight grad %.3f ms\n",
           N, I, O, gemm_ms[n_gemm][0], flops / gemm_ms[n_gemm][0] * 1e-9, gemm_ms[n_gemm][1], gemm_ms[n_gemm][2]);
    gemm_rows[n_gemm][0] = N, gemm_rows[n_gemm][1] = I, gemm_rows[n_gemm][2] = O;
    n_gemm++;
    void *bufs[] = {g.in, g.w, g.out, g.din, g.dw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) k_free(&gpu, bufs[i]);
}

/* ---- attention ---- */

typedef struct attn_case {
    int B, T, Hq, Hkv, hd, bwd;
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
} attn_case;

static void run_attn(void *arg) {
    attn_case *a = arg;
    if (!a->bwd) k_attention_fwd(&gpu, a->out, a->lse, a->q, a->k, a->v, NULL, 0, a->B, a->T, a->Hq, a->Hkv, a->hd);
    else k_attention_bwd(&gpu, a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, NULL, 0, a->B,
                         a->T, a->Hq, a->Hkv, a->hd);
}

static void measure_attention(int B, int T, int Hq, int Hkv, int hd) {
    for (int r = 0; r < n_attn; r++)
        if (attn_rows[r][0] == B && attn_rows[r][1] == T && attn_rows[r][2] == Hq && attn_rows[r][3] == Hkv &&
            attn_rows[r][4] == hd)
            return;
    if (n_attn == MAX_ROWS) die("too many attention shapes");
    size_t cs = k_compute_size(&gpu), nq = (size_t)B * T * Hq * hd, nkv = (size_t)B * T * Hkv * hd;
    attn_case a = {.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd};
    a.q = dev(nq * cs), a.out = dev(nq * cs), a.dout = dev(nq * cs), a.dq = dev(nq * cs);
    a.k = dev(nkv * cs), a.v = dev(nkv * cs), a.dk = dev(nkv * cs), a.dv = dev(nkv * cs);
    a.lse = dev((size_t)B * Hq * T * sizeof(float));
    for (a.bwd = 0; a.bwd < 2; a.bwd++) attn_ms[n_attn][a.bwd] = 1e3 * median_s(run_attn, &a);
    double flops = 4.0 * B * (double)Hq * T * T * hd / 2; /* causal */
    printf("attention B=%d T=%d Hq=%d Hkv=%d hd=%d: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s at 2.5x)\n",
           B, T, Hq, Hkv, hd, attn_ms[n_attn][0], flops / attn_ms[n_attn][0] * 1e-9, attn_ms[n_attn][1],
           2.5 * flops / attn_ms[n_attn][1] * 1e-9);
    int *row = attn_rows[n_attn++];
    row[0] = B, row[1] = T, row[2] = Hq, row[3] = Hkv, row[4] = hd;
    void *bufs[] = {a.q, a.out, a.dout, a.dq, a.k, a.v, a.dk, a.dv, a.lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) k_free(&gpu, bufs[i]);
}

static void measure_model(const llama_config *c, int N) {
    int C = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int q = c->num_attention_heads * hd, kv = c->num_key_value_heads * hd;
    int shapes[][2] = {{C, q}, {C, kv}, {q, C}, {C, I}, {I, C}, {C, c->vocab_size}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int in = shapes[s][0], out = shapes[s][1];
        if (s == 5) measure_gemm(N < 2048 ? N : 2048, in, out); /* the head: 2048 rows at a time */
        else measure_gemm(N, in, out);
        if (s < 5) {
            measure_gemm(N, in, LORA_RANK);  /* LoRA A */
            measure_gemm(N, LORA_RANK, out); /* LoRA B */
        }
    }
    for (int T = 2048; T <= 4096 && T <= N; T *= 2)
        if (N % T == 0) measure_attention(N / T, T, c->num_attention_heads, c->num_key_value_heads, hd);
}

/* One row of T = 8192 ... LONG_ATTENTION_T a model (once, whatever the token counts): the
 * rate long sequences (fsdp.offload_activations' 400k) are predicted from, where attention
 * is most of the step and runs faster per FLOP than at 2048. */
#define LONG_ATTENTION_T 65536
static void measure_long_attention(const llama_config *c) {
    for (int T = 8192; T <= LONG_ATTENTION_T; T *= 2)
        measure_attention(1, T, c->num_attention_heads, c->num_key_value_heads, c->head_dim);
}

/* ---- bandwidths ---- */

typedef struct mem_case {
    int kind;
    size_t n;
    void *a, *b, *c;
    void *host;
} mem_case;

enum { MEM_SWIGLU, MEM_DEQUANT, MEM_CE, MEM_ADAMW, MEM_H2D, MEM_D2H, MEM_LAUNCH, MEM_REGISTERED };

static void run_mem(void *arg) {
    mem_case *m = arg;
    switch (m->kind) {
    case MEM_SWIGLU: k_swiglu_fwd(&gpu, m->c, m->a, m->b, m->n); break;
    case MEM_DEQUANT: k_nf4_dequant(&gpu, m->c, m->a, m->b, NULL, 0.0f, m->n); break;
    case MEM_CE: {
        size_t V = 32000, N = m->n / V;
        k_cross_entropy(&gpu, (float *)m->b, m->a, m->a, (const int32_t *)m->c, (int)N, (int)V, 1.0f);
        break;
    }
    case MEM_ADAMW:
        k_adamw(&gpu, (float *)m->a, (float *)m->b, (float *)m->c, (float *)m->c + m->n, m->n, 1e-4f, 0.9f,
                0.95f, 1e-8f, 0.0f, 1, 1.0f, NULL);
        break;
    case MEM_H2D: k_copy_h2d(&gpu, m->a, m->host, m->n); break;
    case MEM_D2H: k_copy_d2h(&gpu, m->host, m->a, m->n); break;
    case MEM_LAUNCH:
        for (int i = 0; i < 1000; i++) k_zero(&gpu, m->a, 4);
        break;
    case MEM_REGISTERED: /* as fsdp.offload_params streams the model memory */
        k_copy_h2d_wait(&gpu, K_COPY_PARAMS, k_copy_h2d_start(&gpu, K_COPY_PARAMS, m->a, m->host, m->n));
        break;
    }
}

/* GB/s of `bytes` moved by op kind on n elements. */
static double gbps(mem_case *m, double bytes, const char *what) {
    double s = median_s(run_mem, m);
    printf("%s: %.3f ms, %.0f GB/s\n", what, s * 1e3, bytes / s * 1e-9);
    return bytes / s * 1e-9;
}

typedef struct host_adamw {
    float *p, *g, *m, *v;
    size_t n;
} host_adamw;

static void *host_adamw_thread(void *arg) {
    host_adamw *h = arg;
    kctx cpu;
    errbuf err = {{0}};
    if (kctx_init(&cpu, K_CPU, 0, &err)) return NULL;
    k_adamw(&cpu, h->p, h->g, h->m, h->v, h->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f, NULL);
    kctx_destroy(&cpu);
    return NULL;
}

/* Billions of elements a second of the CPU backend's AdamW on every core. */
static double host_adamw_rate(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int T = cores > 0 && cores < 256 ? (int)cores : 1;
    size_t per = (size_t)16 << 20, n = per * (size_t)T;
    float *mem = calloc(4 * n, sizeof *mem);
    if (!mem) die("out of host memory");
    pthread_t th[256];
    host_adamw h[256];
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (int t = 0; t < T; t++) {
            h[t] = (host_adamw){mem + t * per, mem + n + t * per, mem + 2 * n + t * per, mem + 3 * n + t * per, per};
            if (pthread_create(&th[t], NULL, host_adamw_thread, &h[t])) die("pthread_create");
        }
        for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
        double s = now() - t0;
        if (s < best) best = s;
    }
    free(mem);
    printf("host AdamW (CPU backend, %d threads): %.1f M elements/s\n", T, n / best * 1e-6);
    return n / best * 1e-9;
}

/* GB/s of writing 2 GB to a file in dir with fsync at the end. */
static double disk_rate(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/plan_rates.%d.tmp", dir, (int)getpid());
    size_t chunk = (size_t)64 << 20, total = (size_t)2 << 30;
    char *buf = malloc(chunk);
    if (!buf) die("out of host memory");
    memset(buf, 0x5a, chunk);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die("cannot create %s", path);
    double t0 = now();
    for (size_t at = 0; at < total; at += chunk)
        if (write(fd, buf, chunk) != (ssize_t)chunk) die("writing %s failed", path);
    if (fsync(fd) || close(fd)) die("fsync of %s failed", path);
    double s = now() - t0;
    unlink(path);
    free(buf);
    printf("disk write + fsync (%s): %.0f MB/s\n", dir, total / s * 1e-6);
    return total / s * 1e-9;
}

/* The plan's name of a device (proto/plan_rates.h's GPUs), from its CUDA name and memory. */
static const char *gpu_key(const struct cudaDeviceProp *p) {
    static const struct {
        const char *part, *key;
    } names[] = {{"H200", "h200"}, {"H100", "h100"}, {"L40S", "l40s"}, {"4090", "4090"}, {"3090", "3090"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strstr(p->name, names[i].part)) return names[i].key;
    if (strstr(p->name, "A100")) return p->totalGlobalMem > ((size_t)48 << 30) ? "a100-80" : "a100-40";
    die("%s is none of the GPUs the plan knows", p->name);
}

static void write_table(const char *path, double *r, double host_adamw, double disk, size_t context,
                        const char *gpu_name, const char *device) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) die("cannot write %s", tmp);
    fprintf(f, "{\n  \"format\": \"fsdpd-plan-rates/1\",\n  \"gpu\": \"%s\",\n  \"device\": \"%s\",\n",
            gpu_name, device);
    fprintf(f, "  \"context_bytes\": %zu,\n  \"elementwise_gbps\": %.1f,\n  \"dequant_gbps\": %.1f,\n"
               "  \"cross_entropy_gbps\": %.1f,\n  \"adamw_gbps\": %.1f,\n  \"h2d_gbps\": %.1f,\n"
               "  \"d2h_gbps\": %.1f,\n  \"registered_h2d_gbps\": %.1f,\n  \"launch_us\": %.2f,\n"
               "  \"host_adamw_gelems\": %.3f,\n  \"disk_gbps\": %.3f,\n",
            context, r[0], r[1], r[2], r[3], r[4], r[5], r[7], r[6], host_adamw, disk);
    fprintf(f, "  \"gemm\": [\n");
    for (int i = 0; i < n_gemm; i++)
        fprintf(f, "    [%d, %d, %d, %.4f, %.4f, %.4f]%s\n", gemm_rows[i][0], gemm_rows[i][1],
                gemm_rows[i][2], gemm_ms[i][0], gemm_ms[i][1], gemm_ms[i][2], i + 1 < n_gemm ? "," : "");
    fprintf(f, "  ],\n  \"attention\": [\n");
    for (int i = 0; i < n_attn; i++)
        fprintf(f, "    [%d, %d, %d, %d, %d, %.4f, %.4f]%s\n", attn_rows[i][0], attn_rows[i][1],
                attn_rows[i][2], attn_rows[i][3], attn_rows[i][4], attn_ms[i][0], attn_ms[i][1],
                i + 1 < n_attn ? "," : "");
    fprintf(f, "  ]\n}\n");
    if (fflush(f) || fsync(fileno(f)) || fclose(f) || rename(tmp, path)) die("cannot write %s", path);
}

int main(int argc, char **argv) {
    if (argc < 5) die("usage: plan_rates OUT.json DISK_DIR TOKENS,TOKENS,... MODEL.json...");
    errbuf err = {{0}};
    if (kctx_init(&gpu, K_CUDA, 0, &err)) die("%s", err.msg);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) die("cudaMemGetInfo failed");
    size_t context = total_b - free_b; /* an idle GPU: the context, cuBLASLt's workspace, scratch */
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) die("cudaGetDeviceProperties failed");
    printf("%s: %.1f GiB, a context with its workspace holds %.0f MiB\n", prop.name,
           total_b / 1073741824.0, context / 1048576.0);
    int tokens[16], n_tokens = 0;
    for (char *s = argv[3]; *s && n_tokens < 16;) {
        tokens[n_tokens++] = (int)strtol(s, &s, 10);
        if (*s == ',') s++;
    }
    for (int a = 4; a < argc; a++) {
        llama_config c;
        if (llama_config_load(&c, argv[a], &err)) die("%s", err.msg);
        for (int t = 0; t < n_tokens; t++) measure_model(&c, tokens[t]);
        measure_long_attention(&c);
    }

    double r[8];
    size_t n = (size_t)64 << 20, cs = k_compute_size(&gpu);
    mem_case m = {.kind = MEM_SWIGLU, .n = n};
    m.a = dev(n * 4), m.b = dev(n * 4), m.c = dev(2 * n * 4);
    r[0] = gbps(&m, 3.0 * n * cs, "SwiGLU (elementwise)");
    m.kind = MEM_DEQUANT;
    r[1] = gbps(&m, n * cs + n / 2.0 + n / 64.0 * 4, "NF4 dequantization");
    m.kind = MEM_CE;
    k_zero(&gpu, m.c, n * 4); /* targets 0 */
    r[2] = gbps(&m, 2.0 * (n / 32000 * 32000) * cs, "cross entropy (logits read and written)");
    m.kind = MEM_ADAMW;
    m.n = n / 2;
    r[3] = gbps(&m, 28.0 * m.n, "AdamW (fp32)");
    m.n = (size_t)1 << 30;
    k_free(&gpu, m.a);
    m.a = dev(m.n);
    m.host = k_host_alloc(&gpu, m.n, &err);
    if (!m.host) die("%s", err.msg);
    m.kind = MEM_H2D;
    r[4] = gbps(&m, (double)m.n, "pinned host to device");
    m.kind = MEM_D2H;
    r[5] = gbps(&m, (double)m.n, "device to pinned host");
    m.kind = MEM_LAUNCH;
    r[6] = median_s(run_mem, &m) * 1e3; /* 1000 launches: ms = us a launch */
    printf("a launch: %.2f us\n", r[6]);
    /* read-only registered memory, as the model memory is (a private mapping made read-only) */
    void *image = mmap(NULL, m.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (image == MAP_FAILED) die("mmap of %zu bytes failed", m.n);
    memset(image, 0x3c, m.n);
    if (mprotect(image, m.n, PROT_READ)) die("mprotect failed");
    k_host_register(&gpu, image, m.n, 0);
    if (k_check(&gpu, &err)) die("%s", err.msg);
    k_host_free(&gpu, m.host);
    m.kind = MEM_REGISTERED;
    m.host = image;
    r[7] = gbps(&m, (double)m.n, "registered read-only host memory to device (copy stream)");
    k_host_unregister(&gpu, image);
    munmap(image, m.n);
    double host = host_adamw_rate(), disk = disk_rate(argv[2]);
    write_table(argv[1], r, host, disk, context, gpu_key(&prop), prop.name);
    printf("wrote %s: %d GEMM shapes, %d attention shapes\n", argv[1], n_gemm, n_attn);
    kctx_destroy(&gpu);
    return 0;
}
