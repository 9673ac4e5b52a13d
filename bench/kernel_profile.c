/* kernel_profile: a CUPTI activity collector loaded into any CUDA process through
 * CUDA_INJECTION64_PATH (the way Nsight Systems attaches), for a step's profile where nsys
 * is not installed.  Every kernel's name and GPU time is summed per process; the table is
 * rewritten to $KPROF_OUT.<pid>.tsv (count, total ns, name) whenever CUPTI hands back a
 * buffer and at exit, so a process that is killed still leaves its last table.  Only
 * kernels are recorded (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: they keep their real
 * overlap); KPROF_SKIP_S (default 0) leaves out what ran in the first seconds after
 * CUDA's start (initialisation, a model's random fill), and KPROF_START_FILE, when set,
 * everything before that file exists (a thread looks for it every 20 ms): a caller that sees
 * training steps go by creates it, however long the load before them took.  The table also
 * gives where the GPU sat idle: every gap of at least GAP_MIN_NS between the recorded
 * kernels' merged intervals, summed by the pair of kernels around it ("# gap" lines: count,
 * total ns, the kernel before and the kernel after), so a step's idle time names the host
 * work that left it idle.
 *
 * Built and run by bench/kernel_profile.sh on a machine with CUPTI (it is not part of the
 * product or of `make`); KERNEL_RECORD names the CUpti_ActivityKernelN that this CUPTI
 * emits (the script takes the newest in cupti_activity.h). */
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef KERNEL_RECORD
#error "KERNEL_RECORD: the CUpti_ActivityKernelN of this CUPTI (bench/kernel_profile.sh sets it)"
#endif

#define BUFFER_BYTES (1u << 20)
#define MAX_KERNELS 4096
#define GAP_MIN_NS 10000 /* 10 us: shorter gaps are the launch's own */
#define MAX_GAPS 512

typedef struct kernel_sum {
    char *name;
    uint64_t count, ns;
} kernel_sum;

/* A recorded kernel's interval; name: its index in sums. */
typedef struct span {
    uint64_t start, end;
    int name;
} span;

typedef struct gap_sum {
    int before, after; /* indices in sums */
    uint64_t count, ns;
} gap_sum;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* CUPTI's thread and exit's */
static kernel_sum sums[MAX_KERNELS];
static int n_sums, overflowed, spans_lost; /* spans_lost: out of memory for the gaps */
static uint64_t skip_before_ns; /* GPU timestamps before this are left out */
static const char *start_file;  /* KPROF_START_FILE */
static uint64_t started_ns;     /* when start_file was seen (atomic; 0: not yet) */
static uint64_t first_ns, last_ns; /* the recorded kernels' span */
static span *spans;                /* every recorded kernel, for the gaps */
static size_t n_spans, cap_spans;
static gap_sum gaps[MAX_GAPS];
static int n_gaps;

static kernel_sum *sum_of(const char *name) {
    for (int i = 0; i < n_sums; i++)
        if (strcmp(sums[i].name, name) == 0) return &sums[i];
    if (n_sums == MAX_KERNELS) {
        overflowed = 1;
        return NULL;
    }
    char *copy = strdup(name);
    if (!copy) return NULL;
    sums[n_sums] = (kernel_sum){copy, 0, 0};
    return &sums[n_sums++];
}

static int by_start(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void add_gap(int before, int after, uint64_t ns) {
    for (int i = 0; i < n_gaps; i++)
        if (gaps[i].before == before && gaps[i].after == after) {
            gaps[i].count++;
            gaps[i].ns += ns;
            return;
        }
    if (n_gaps < MAX_GAPS) gaps[n_gaps++] = (gap_sum){before, after, 1, ns};
}

/* The gaps between the spans' merged intervals, recounted from every span so far. */
static void count_gaps(void) {
    n_gaps = 0;
    if (n_spans == 0) return;
    qsort(spans, n_spans, sizeof *spans, by_start);
    uint64_t busy_end = spans[0].end;
    int last = spans[0].name; /* the kernel that ends the busy interval */
    for (size_t i = 1; i < n_spans; i++) {
        if (spans[i].start >= busy_end + GAP_MIN_NS) add_gap(last, spans[i].name, spans[i].start - busy_end);
        if (spans[i].end > busy_end) {
            busy_end = spans[i].end;
            last = spans[i].name;
        }
    }
}

/* NCCL's kernels: ncclKernel_..., ncclDevKernel_... */
static int is_comm(int name) {
    return strncmp(sums[name].name, "nccl", 4) == 0;
}

/* The merged intervals of the spans (sorted by start) whose is_comm is `comm`, into out;
 * their count. */
static size_t merged(int comm, span *out) {
    size_t n = 0;
    for (size_t i = 0; i < n_spans; i++) {
        if (is_comm(spans[i].name) != comm) continue;
        if (n && spans[i].start <= out[n - 1].end) {
            if (spans[i].end > out[n - 1].end) out[n - 1].end = spans[i].end;
        } else {
            out[n++] = spans[i];
        }
    }
    return n;
}

/* The communication kernels' busy time and the part of it no other kernel overlaps (after
 * count_gaps sorted the spans); both 0 when out of memory (said in the table). */
static int comm_time(uint64_t *busy, uint64_t *exposed) {
    *busy = *exposed = 0;
    span *c = malloc((n_spans + 1) * sizeof *c), *k = malloc((n_spans + 1) * sizeof *k);
    if (!c || !k) {
        free(c), free(k);
        return -1;
    }
    size_t nc = merged(1, c), nk = merged(0, k), j = 0;
    for (size_t i = 0; i < nc; i++) {
        uint64_t len = c[i].end - c[i].start, covered = 0;
        while (j < nk && k[j].end <= c[i].start) j++;
        for (size_t m = j; m < nk && k[m].start < c[i].end; m++) {
            uint64_t lo = k[m].start > c[i].start ? k[m].start : c[i].start;
            uint64_t hi = k[m].end < c[i].end ? k[m].end : c[i].end;
            covered += hi - lo;
        }
        *busy += len;
        *exposed += len - covered;
    }
    free(c), free(k);
    return 0;
}

static void write_table(void) {
    const char *prefix = getenv("KPROF_OUT");
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s.%d.tsv", prefix ? prefix : "kprof", (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "# span_ns\t%llu\n", (unsigned long long)(last_ns > first_ns ? last_ns - first_ns : 0));
    if (overflowed) fprintf(f, "# more than %d kernel names: the rest are not counted\n", MAX_KERNELS);
    if (spans_lost) fprintf(f, "# out of memory for the kernels' intervals: the gaps are partial\n");
    for (int i = 0; i < n_sums; i++)
        fprintf(f, "%llu\t%llu\t%s\n", (unsigned long long)sums[i].count, (unsigned long long)sums[i].ns,
                sums[i].name);
    count_gaps();
    for (int i = 0; i < n_gaps; i++)
        fprintf(f, "# gap\t%llu\t%llu\t%s\t%s\n", (unsigned long long)gaps[i].count,
                (unsigned long long)gaps[i].ns, sums[gaps[i].before].name, sums[gaps[i].after].name);
    uint64_t busy, exposed;
    if (comm_time(&busy, &exposed) == 0)
        fprintf(f, "# comm\t%llu\t%llu\n", (unsigned long long)busy, (unsigned long long)exposed);
    else
        fprintf(f, "# out of memory for the communication's intervals\n");
    if (fclose(f) == 0) rename(tmp, path);
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *record = NULL;
    const uint64_t started = __atomic_load_n(&started_ns, __ATOMIC_ACQUIRE);
    const uint64_t from = started > skip_before_ns ? started : skip_before_ns;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const KERNEL_RECORD *k = (const KERNEL_RECORD *)record;
        if ((start_file && !started) || k->start < from || !k->name) continue;
        kernel_sum *s = sum_of(k->name);
        if (!s) continue;
        s->count++;
        s->ns += k->end - k->start;
        if (n_spans == cap_spans) {
            size_t cap = cap_spans ? 2 * cap_spans : 65536;
            span *grown = realloc(spans, cap * sizeof *spans);
            if (grown) spans = grown, cap_spans = cap;
        }
        if (n_spans < cap_spans) spans[n_spans++] = (span){k->start, k->end, (int)(s - sums)};
        else spans_lost = 1;
        if (!first_ns || k->start < first_ns) first_ns = k->start;
        if (k->end > last_ns) last_ns = k->end;
    }
    write_table();
    pthread_mutex_unlock(&lock);
    free(buffer);
}

static void at_exit(void) {
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&lock);
    write_table();
    pthread_mutex_unlock(&lock);
}

static void *watch_start_file(void *arg) {
    (void)arg;
    while (access(start_file, F_OK) != 0) usleep(20000);
    uint64_t now = 0;
    if (cuptiGetTimestamp(&now) == CUPTI_SUCCESS) __atomic_store_n(&started_ns, now, __ATOMIC_RELEASE);
    return NULL;
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void) {
    const char *skip = getenv("KPROF_SKIP_S");
    uint64_t now = 0;
    if (cuptiGetTimestamp(&now) != CUPTI_SUCCESS) return 0;
    skip_before_ns = now + (uint64_t)((skip ? atof(skip) : 0.0) * 1e9);
    start_file = getenv("KPROF_START_FILE");
    pthread_t watcher;
    if (start_file && (pthread_create(&watcher, NULL, watch_start_file, NULL) != 0 || pthread_detach(watcher) != 0))
        return 0;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
        return 0;
    atexit(at_exit);
    return 1;
}
