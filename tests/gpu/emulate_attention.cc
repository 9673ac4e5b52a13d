/* emulate_attention: the CUDA attention kernels (kernels/cuda/cuda_attention.cu) run on the
 * host through the emulation in emu/kernels/cuda/cuda_kernels.h, checked against the CPU
 * reference (kernels/cpu/cpu_attention.c).  Needs no GPU: it checks the kernels' tiling,
 * fragment layouts, masking, barriers and copy pipeline before a device run.
 *
 * The build (tests/gpu/Makefile) deletes the file's "device primitives" section and rewrites
 * each `kernel<<<grid, threads, smem, stream>>>(params);` line as an emu_launch call.
 *
 * Every shape runs with 8-warp blocks (shared-memory limit of sm_90) and 4-warp blocks (that
 * of sm_86), once with thread 0 first and copies landing late, once with the last thread
 * first and copies landing early; unpacked and packed (varlen documents, k_docs), with and
 * without a sliding window (Mistral: the band the dispatcher folds into document bounds).
 * One line per check; the last line is "N passed, N failed". */
#include "emu_cuda_attention.inc"

extern "C" {
#include "kernels/cpu/cpu_kernels.h"
}

#include <algorithm>
#include <string>

static int n_passed, n_failed;

/* The CPU reference's k_fail (kernels/kctx.c is not linked in: its k_check needs errbuf). */
extern "C" void k_fail(kctx *c, const char *fmt, ...) {
    if (c->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
    c->failed = 1;
}

static uint64_t rng = 88172645463325252ull;
static float frand() { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A device buffer: the values plus 2048 guard elements that must stay untouched. */
enum { GUARD = 2048 };
struct dbuf {
    std::vector<bf16> v;
    size_t n;
    explicit dbuf(size_t n_) : v(n_ + GUARD, bf16{0xffff}), n(n_) {
        emu.globals.push_back({(const char *)v.data(), n * sizeof(bf16)});
    }
    bf16 *p() { return v.data(); }
};
struct fbuf {
    std::vector<float> v;
    size_t n;
    explicit fbuf(size_t n_) : v(n_ + GUARD, NAN), n(n_) {
        emu.globals.push_back({(const char *)v.data(), n * sizeof(float)});
    }
    float *p() { return v.data(); }
};

static void verdict(const std::string &what, bool ok, const char *measure) {
    printf("%-60s %-22s %s\n", what.c_str(), measure, ok ? "PASS" : "FAIL");
    fflush(stdout);
    if (ok)
        n_passed++;
    else
        n_failed++;
}

/* ||got - want|| / ||want||; NaN anywhere, or a guard element overwritten, fails. */
static void compare(const std::string &what, const float *got, const float *want, size_t n,
                    bool guard_ok, double tol, double abs_tol) {
    double diff = 0, norm = 0, max_abs = 0;
    size_t nans = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) {
            nans++;
            continue;
        }
        double d = (double)got[i] - want[i];
        diff += d * d;
        norm += (double)want[i] * want[i];
        max_abs = fabs(d) > max_abs ? fabs(d) : max_abs;
    }
    double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
    char measure[64];
    snprintf(measure, sizeof measure, "rel %.2e max %.1e%s%s", rel, max_abs, nans ? " NaN" : "",
             guard_ok ? "" : " GUARD");
    verdict(what, !nans && guard_ok && (rel <= tol || max_abs <= abs_tol), measure);
}

static std::vector<float> values(const dbuf &b) {
    std::vector<float> out(b.n);
    for (size_t i = 0; i < b.n; i++) out[i] = emu_bf16_value(b.v[i].bits);
    return out;
}
static bool guard_ok(const dbuf &b) {
    for (size_t i = b.n; i < b.n + GUARD; i++)
        if (b.v[i].bits != 0xffff) return false;
    return true;
}
static bool guard_ok(const fbuf &b) {
    for (size_t i = b.n; i < b.n + GUARD; i++)
        if (!isnan(b.v[i])) return false;
    return true;
}

static void fill(dbuf &d, std::vector<float> &host, float scale) {
    host.resize(d.n);
    for (size_t i = 0; i < d.n; i++) {
        d.v[i].bits = emu_bf16_bits(scale * frand());
        host[i] = emu_bf16_value(d.v[i].bits);
    }
}

static kctx make_gpu(cuda_impl *impl) {
    kctx c;
    memset(&c, 0, sizeof c);
    c.backend = K_CUDA;
    c.compute = K_BF16;
    c.impl = impl;
    return c;
}

/* Varlen: each row packed with documents of the given lengths, cycled (row b starting at its
 * b-th length), the last one cut at T; k_docs over host vectors (the emulated device memory). */
struct packed_docs {
    std::vector<int32_t> start, end;
    k_docs docs;
    std::string name;
    packed_docs(int B, int T, const std::vector<int> &lens)
        : start((size_t)B * T), end((size_t)B * T) {
        for (int b = 0; b < B; b++)
            for (int t = 0, i = b; t < T; i++) {
                int n = std::min(lens[i % lens.size()], T - t);
                for (int u = t; u < t + n; u++) {
                    start[(size_t)b * T + u] = t;
                    end[(size_t)b * T + u] = t + n;
                }
                t += n;
            }
        docs = {start.data(), end.data()};
        name = " docs";
        for (int n : lens) name += " " + std::to_string(n);
    }
};

static void check(int B, int T, int Hq, int Hkv, int hd, const packed_docs *packed = NULL,
                  int window = 0) {
    const k_docs *docs = packed ? &packed->docs : NULL;
    size_t nq = (size_t)B * T * Hq * hd, nkv = (size_t)B * T * Hkv * hd, nl = (size_t)B * Hq * T;
    dbuf q(nq), k(nkv), v(nkv), dout(nq);
    std::vector<float> hq, hk, hv, hdout;
    fill(q, hq, 4.0f);
    fill(k, hk, 2.0f);
    fill(v, hv, 1.0f);
    fill(dout, hdout, 1.0f);

    kctx cpu;
    memset(&cpu, 0, sizeof cpu);
    std::vector<float> want_out(nq), want_lse(nl), want_dq(nq), want_dk(nkv), want_dv(nkv);
    cpu_attention_fwd(&cpu, want_out.data(), want_lse.data(), hq.data(), hk.data(), hv.data(),
                      docs, window, B, T, Hq, Hkv, hd);
    /* the backward's `out` input is bf16 on the GPU: give the CPU the same values */
    dbuf out_in(nq);
    std::vector<float> out_rounded(nq);
    for (size_t i = 0; i < nq; i++) {
        out_in.v[i].bits = emu_bf16_bits(want_out[i]);
        out_rounded[i] = emu_bf16_value(out_in.v[i].bits);
    }
    fbuf lse_in(nl);
    memcpy(lse_in.p(), want_lse.data(), nl * sizeof(float));
    cpu_attention_bwd(&cpu, want_dq.data(), want_dk.data(), want_dv.data(), hdout.data(),
                      hq.data(), hk.data(), hv.data(), out_rounded.data(), want_lse.data(), docs,
                      window, B, T, Hq, Hkv, hd);
    if (cpu.failed) emu_die("CPU reference: %s", cpu.failure);

    static const struct {
        int smem_optin;
        bool reverse, eager;
        const char *name;
    } modes[] = {{232448, false, false, "sm_90 blocks, thread 0 first, late copies"},
                 {232448, true, true, "sm_90 blocks, last thread first, early copies"},
                 {101376, false, true, "sm_86 blocks, thread 0 first, early copies"},
                 {101376, true, false, "sm_86 blocks, last thread first, late copies"}};
    for (const auto &mode : modes) {
        emu.smem_optin = mode.smem_optin;
        emu.reverse = mode.reverse;
        emu.eager = mode.eager;
        cuda_impl impl;
        impl.stream = NULL;
        impl.smem_optin = mode.smem_optin;
        impl.attention_sm90 = 0;
        kctx gpu = make_gpu(&impl);
        char shape[96];
        snprintf(shape, sizeof shape, "B=%d T=%d Hq=%d Hkv=%d hd=%d", B, T, Hq, Hkv, hd);
        std::string tag = std::string(shape) + (packed ? packed->name : "") +
                          (window ? " window " + std::to_string(window) : "") + " (" + mode.name + ")";

        dbuf out(nq);
        fbuf lse(nl);
        cuda_attention_fwd(&gpu, out.p(), lse.p(), q.p(), k.p(), v.p(), docs, window, B, T, Hq,
                           Hkv, hd);
        if (gpu.failed) emu_die("%s: %s", tag.c_str(), gpu.failure);
        compare("fwd out  " + tag, values(out).data(), want_out.data(), nq, guard_ok(out), 2e-2, 0);
        compare("fwd lse  " + tag, lse.p(), want_lse.data(), nl, guard_ok(lse), 1e-3, 1e-2);

        dbuf dq(nq), dk(nkv), dv(nkv);
        cuda_attention_bwd(&gpu, dq.p(), dk.p(), dv.p(), dout.p(), q.p(), k.p(), v.p(),
                           out_in.p(), lse_in.p(), docs, window, B, T, Hq, Hkv, hd);
        if (gpu.failed) emu_die("%s: %s", tag.c_str(), gpu.failure);
        compare("bwd dq   " + tag, values(dq).data(), want_dq.data(), nq, guard_ok(dq), 2e-2, 0);
        compare("bwd dk   " + tag, values(dk).data(), want_dk.data(), nkv, guard_ok(dk), 2e-2, 0);
        compare("bwd dv   " + tag, values(dv).data(), want_dv.data(), nkv, guard_ok(dv), 2e-2, 0);
    }
}

/* Bad arguments fail the context with a message naming the problem. */
static void check_failure(const char *what, int Hq, int Hkv, int hd, int offset,
                          const char *wanted, int window = 0) {
    cuda_impl impl;
    impl.stream = NULL;
    impl.smem_optin = 232448;
    impl.attention_sm90 = 0;
    kctx gpu = make_gpu(&impl);
    dbuf buf(4096);
    fbuf lse(64);
    bf16 *p = buf.p() + offset;
    cuda_attention_fwd(&gpu, p, lse.p(), p, p, p, NULL, window, 1, 4, Hq, Hkv, hd);
    bool ok = gpu.failed && strstr(gpu.failure, wanted);
    std::string note = std::string(what) + ": \"" + (gpu.failed ? gpu.failure : "no failure") + "\"";
    verdict(note, ok, "k_fail message");
}

int main(int argc, char **argv) {
    bool quick = argc == 2 && strcmp(argv[1], "--quick") == 0;
    if (argc > 2 || (argc == 2 && !quick)) {
        fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
        return 2;
    }
    check_failure("head dim 96", 2, 1, 96, 0, "head dim 96 is not supported");
    check_failure("heads 6/4", 6, 4, 64, 0, "6 query heads are not a multiple of 4");
    check_failure("unaligned", 2, 2, 64, 1, "16-byte aligned");
    check_failure("window -1", 2, 2, 64, 0, "sliding window -1 is negative", -1);

    check(2, 1, 2, 1, 128);
    check(2, 17, 4, 2, 64);
    check(1, 150, 3, 1, 128); /* GQA 3:1, partial tiles */
    /* varlen: documents ending inside tiles, whole tiles before a row's document skipped
     * (the second query block of each row starts in a document that starts past key 64) */
    const packed_docs mixed(2, 200, {1, 17, 100, 5, 77});
    check(2, 200, 4, 2, 64, &mixed);
    /* a document starting 4 key tiles into its query block (the layout that hung the sm_90a
     * forward: its skipped tiles outnumbered the ring's) */
    const packed_docs late(1, 300, {257, 43});
    check(1, 300, 2, 1, 64, &late);
    /* sliding window: a band across tile edges, whole key tiles before it skipped (the second
     * query block's band starts at key 92), and the band inside packed documents */
    check(2, 200, 4, 2, 64, NULL, 37);
    check(2, 200, 4, 2, 64, &mixed, 23);
    if (!quick) {
        check(1, 300, 3, 1, 128, NULL, 64);
        check(1, 150, 2, 2, 128, NULL, 1);
        check(1, 150, 2, 2, 64, NULL, 150); /* as long as the row: no window */
        const packed_docs long_doc(1, 300, {1, 17, 260, 3});
        check(1, 300, 3, 1, 128, &long_doc);
        const packed_docs short_docs(2, 150, {1, 2, 31, 16, 9});
        check(2, 150, 2, 2, 128, &short_docs);
        check(1, 300, 3, 1, 128, &long_doc, 100);
        check(1, 17, 2, 2, 128);
        check(1, 200, 6, 2, 64);
        check(1, 257, 2, 1, 128);
        check(1, 300, 2, 2, 64);
    }
    printf("(%ld launches, %ld thread switches)\n", emu.launches, emu.switches);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
