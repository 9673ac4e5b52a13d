// The CUDA backend: devices, contexts (stream, cuBLASLt handle and workspace, scratch),
// failures, memory and copies.
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_kernels.h"

#define CUDA_WORKSPACE_BYTES ((size_t)32 << 20) // cuBLASLt's recommendation for Hopper

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); // no driver or no device: report none, clear the error
        return 0;
    }
    return n;
}

extern "C" size_t cuda_device_memory(int device) {
    cudaDeviceProp p;
    if (device < 0 || device >= cuda_device_count() || cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return p.totalGlobalMem;
}

// ---- failures ----

void cuda_check_launch(kctx *c, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) k_fail(c, "CUDA %s: launch failed: %s", what, cudaGetErrorString(e));
}

int cuda_check_call(kctx *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError(); // the error is reported here; don't let it leak into the next check
    k_fail(c, "CUDA %s: %s", what, cudaGetErrorString(e));
    return -1;
}

// The message of a bad input a kernel reported (the same wording as the CPU backend).
static void fail_on_kernel_report(kctx *c, const cuda_input_error *e) {
    switch (e->code) {
    case CUDA_EMBEDDING_TOKEN:
        k_fail(c, "embedding: token %d at row %d is outside the vocabulary [0, %d)", e->value,
               e->row, e->limit);
        break;
    case CUDA_EMBEDDING_BWD_TOKEN:
        k_fail(c, "embedding backward: token %d at row %d is outside the vocabulary [0, %d)",
               e->value, e->row, e->limit);
        break;
    case CUDA_CE_TARGET:
        k_fail(c, "cross_entropy: target %d at row %d is outside the vocabulary [0, %d)",
               e->value, e->row, e->limit);
        break;
    default:
        k_fail(c, "CUDA: a kernel reported unknown error code %d", e->code);
    }
}

// Waits for the stream; then reports (and clears) the first bad input a kernel found.
extern "C" void cuda_sync(kctx *c) {
    cuda_impl *s = cuda_state(c);
    cuda_input_error report;
    for (int lane = 0; lane < K_COPY_LANES; lane++)
        if (s->copy_lanes[lane].stream &&
            cuda_check_call(c, cudaStreamSynchronize(s->copy_lanes[lane].stream), "copy stream synchronize"))
            return;
    if (cuda_check_call(c, cudaStreamSynchronize(s->stream), "stream synchronize") ||
        cuda_check_call(c,
                        cudaMemcpyAsync(&report, s->error, sizeof report, cudaMemcpyDeviceToHost,
                                        s->stream),
                        "reading kernel error reports") ||
        cuda_check_call(c, cudaStreamSynchronize(s->stream), "stream synchronize"))
        return;
    if (report.code == CUDA_INPUT_OK) return;
    fail_on_kernel_report(c, &report);
    cuda_check_call(c, cudaMemsetAsync(s->error, 0, sizeof *s->error, s->stream),
                    "clearing kernel error reports");
}

// ---- contexts ----

extern "C" void cuda_destroy(kctx *c) {
    cuda_impl *s = cuda_state(c);
    if (!s) return;
    // Teardown: errors here have nobody left to report to.
    if (s->stream) (void)cudaStreamSynchronize(s->stream);
    for (int lane = 0; lane < K_COPY_LANES; lane++) {
        cuda_copy_lane *l = &s->copy_lanes[lane];
        if (l->stream) (void)cudaStreamSynchronize(l->stream), (void)cudaStreamDestroy(l->stream);
        for (int i = 0; i < COPY_EVENTS; i++)
            if (l->done[i]) (void)cudaEventDestroy(l->done[i]);
    }
    if (s->copy_ready) (void)cudaEventDestroy(s->copy_ready);
    cuda_gemm_cache_clear(s);
    if (s->lt) (void)cublasLtDestroy(s->lt);
    if (s->workspace) (void)cudaFree(s->workspace);
    if (s->scratch) (void)cudaFree(s->scratch);
    if (s->error) (void)cudaFree(s->error);
    if (s->stream) (void)cudaStreamDestroy(s->stream);
    (void)cudaGetLastError();
    free(s);
    c->impl = NULL;
    c->stream = NULL;
}

static int init_failed(kctx *c, errbuf *err, const char *what, const char *why) {
    cuda_destroy(c);
    return errf(err, "CUDA backend on device %d: %s: %s", c->device, what, why);
}

extern "C" int cuda_init(kctx *c, int device, errbuf *err) {
    int count = cuda_device_count();
    if (device < 0 || device >= count)
        return errf(err, "CUDA backend: device %d does not exist (%d device%s visible)", device,
                    count, count == 1 ? "" : "s");
    cuda_impl *s = (cuda_impl *)calloc(1, sizeof *s);
    if (!s) return errf(err, "CUDA backend: out of host memory");
    c->impl = s;
    cudaError_t e;
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return init_failed(c, err, "cudaSetDevice", cudaGetErrorString(e));
    if ((e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return init_failed(c, err, "creating the stream", cudaGetErrorString(e));
    c->stream = s->stream;
    if ((e = cudaDeviceGetAttribute(&s->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device)) != cudaSuccess)
        return init_failed(c, err, "reading the shared-memory limit", cudaGetErrorString(e));
    if ((e = cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, device)) !=
        cudaSuccess)
        return init_failed(c, err, "reading the multiprocessor count", cudaGetErrorString(e));
    if (cuda_attention_sm90_setup(c, device, err)) {
        cuda_destroy(c);
        return -1;
    }
    cublasStatus_t st = cublasLtCreate(&s->lt);
    if (st != CUBLAS_STATUS_SUCCESS)
        return init_failed(c, err, "cublasLtCreate", cublasLtGetStatusString(st));
    s->workspace_bytes = CUDA_WORKSPACE_BYTES;
    if ((e = cudaMalloc(&s->workspace, s->workspace_bytes)) != cudaSuccess)
        return init_failed(c, err, "allocating the cuBLASLt workspace", cudaGetErrorString(e));
    if ((e = cudaMalloc((void **)&s->error, sizeof *s->error)) != cudaSuccess ||
        (e = cudaMemsetAsync(s->error, 0, sizeof *s->error, s->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(s->stream)) != cudaSuccess)
        return init_failed(c, err, "allocating the error report", cudaGetErrorString(e));
    return 0;
}

void *cuda_scratch(kctx *c, size_t bytes, const char *what) {
    cuda_impl *s = cuda_state(c);
    if (bytes <= s->scratch_bytes) return s->scratch;
    // Earlier ops may still be using the old buffer.
    if (cuda_check_call(c, cudaStreamSynchronize(s->stream), what)) return NULL;
    if (s->scratch) (void)cudaFree(s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    size_t grown = bytes + bytes / 4; // some headroom for the next, slightly larger, request
    if (cuda_check_call(c, cudaMalloc(&s->scratch, grown), what)) return NULL;
    s->scratch_bytes = grown;
    return s->scratch;
}

// ---- memory ----

extern "C" void *cuda_alloc(kctx *c, size_t bytes, errbuf *err) {
    cuda_impl *s = cuda_state(c);
    void *p = NULL;
    size_t n = bytes ? bytes : 1; // cudaMalloc(0) gives NULL, which would read as a failure
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        errf(err, "k_alloc: cudaMalloc of %zu bytes on device %d: %s", bytes, c->device,
             cudaGetErrorString(e));
        return NULL;
    }
    if ((e = cudaMemsetAsync(p, 0, n, s->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(s->stream)) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaFree(p);
        errf(err, "k_alloc: zeroing %zu bytes on device %d: %s", bytes, c->device,
             cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

extern "C" void cuda_free(kctx *c, void *p) {
    // Queued work may still use p.
    cuda_check_call(c, cudaStreamSynchronize(cuda_stream(c)), "free: stream synchronize");
    cuda_check_call(c, cudaFree(p), "cudaFree");
}

// The comm watchdog's test: park a stream until the host releases the flag.
__global__ void spin_until_set(volatile int *flag) {
    while (*flag == 0) __nanosleep(1000);
}

extern "C" void cuda_test_spin(void *stream, int *flag) {
    int *device_view = NULL;
    if (cudaHostGetDevicePointer((void **)&device_view, flag, 0) != cudaSuccess) return;
    spin_until_set<<<1, 1, 0, (cudaStream_t)stream>>>(device_view);
}

// Pinned host memory: copies from and to it run at full PCIe/NVLink speed, asynchronously.
extern "C" void *cuda_host_alloc(kctx *c, size_t bytes, errbuf *err) {
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    cudaError_t e = cudaMallocHost(&p, n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        errf(err, "k_host_alloc: cudaMallocHost of %zu bytes: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    (void)c;
    memset(p, 0, n);
    return p;
}

extern "C" void cuda_host_free(kctx *c, void *p) {
    // Queued copies may still read or write p.
    cuda_check_call(c, cudaStreamSynchronize(cuda_stream(c)), "host free: stream synchronize");
    cuda_check_call(c, cudaFreeHost(p), "cudaFreeHost");
}

extern "C" void cuda_copy_h2d(kctx *c, void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t stream = cuda_stream(c);
    cuda_check_call(c, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, stream),
                    "copy host to device");
}

// Lane `lane` of k_copy_h2d_start, its stream and events made on first use (all or none);
// `copy_ready` (one for every lane) orders a copy after the compute queued before it.
static cuda_copy_lane *copy_lane(kctx *c, int lane) {
    cuda_impl *s = cuda_state(c);
    cuda_copy_lane *l = &s->copy_lanes[lane], made = {};
    if (l->stream) return l;
    if (!s->copy_ready && cuda_check_call(c, cudaEventCreateWithFlags(&s->copy_ready, cudaEventDisableTiming),
                                          "creating the copy events"))
        return NULL;
    int ok = cuda_check_call(c, cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking),
                             "creating a copy stream") == 0;
    for (int i = 0; ok && i < COPY_EVENTS; i++)
        ok = cuda_check_call(c, cudaEventCreateWithFlags(&made.done[i], cudaEventDisableTiming),
                             "creating the copy events") == 0;
    if (ok) {
        *l = made;
        return l;
    }
    for (int i = 0; i < COPY_EVENTS; i++)
        if (made.done[i]) (void)cudaEventDestroy(made.done[i]);
    if (made.stream) (void)cudaStreamDestroy(made.stream);
    return NULL;
}

extern "C" uint64_t cuda_copy_h2d_start(kctx *c, int lane, void *dst, const void *host_src, size_t bytes) {
    cuda_impl *s = cuda_state(c);
    cuda_copy_lane *l = copy_lane(c, lane);
    if (!l) return 0;
    if (!bytes) return l->started;
    if (cuda_check_call(c, cudaEventRecord(s->copy_ready, s->stream), "copy start: event") ||
        cuda_check_call(c, cudaStreamWaitEvent(l->stream, s->copy_ready, 0), "copy start: wait") ||
        cuda_check_call(c, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, l->stream),
                        "copy host to device (copy stream)") ||
        cuda_check_call(c, cudaEventRecord(l->done[l->started % COPY_EVENTS], l->stream), "copy start: event"))
        return l->started;
    return ++l->started;
}

extern "C" void cuda_copy_h2d_wait(kctx *c, int lane, uint64_t upto) {
    cuda_impl *s = cuda_state(c);
    const cuda_copy_lane *l = &s->copy_lanes[lane];
    const uint64_t t = upto < l->started ? upto : l->started;
    if (t == 0) return; // nothing started (or asked for)
    cuda_check_call(c, cudaStreamWaitEvent(s->stream, l->done[(t - 1) % COPY_EVENTS], 0), "copy wait");
}

extern "C" void cuda_host_register(kctx *c, const void *p, size_t bytes, int writable) {
    if (writable) {
        cuda_check_call(c, cudaHostRegister((void *)p, bytes, cudaHostRegisterDefault), "cudaHostRegister");
        return;
    }
    int read_only = 0;
    if (cuda_check_call(c, cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported,
                                                  c->device),
                        "reading the host-register attribute"))
        return;
    if (!read_only) {
        k_fail(c, "device %d cannot register read-only host memory", c->device);
        return;
    }
    cuda_check_call(c, cudaHostRegister((void *)p, bytes, cudaHostRegisterReadOnly),
                    "cudaHostRegister (read-only)");
}

extern "C" void cuda_host_unregister(kctx *c, const void *p) {
    cuda_check_call(c, cudaStreamSynchronize(cuda_stream(c)), "host unregister: synchronize");
    for (int lane = 0; lane < K_COPY_LANES; lane++)
        if (cuda_state(c)->copy_lanes[lane].stream)
            cuda_check_call(c, cudaStreamSynchronize(cuda_state(c)->copy_lanes[lane].stream),
                            "host unregister: synchronize the copies");
    cuda_check_call(c, cudaHostUnregister((void *)p), "cudaHostUnregister");
}

extern "C" void cuda_copy_d2h(kctx *c, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t stream = cuda_stream(c);
    if (cuda_check_call(c, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, stream),
                        "copy device to host"))
        return;
    cuda_check_call(c, cudaStreamSynchronize(stream), "copy device to host: synchronize");
}

extern "C" void cuda_zero(kctx *c, void *p, size_t bytes) {
    if (!bytes) return;
    cuda_check_call(c, cudaMemsetAsync(p, 0, bytes, cuda_stream(c)), "memset");
}
