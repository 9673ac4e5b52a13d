/* host_memory: see host_memory.h. */
#include "daemon/host_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"

long long proc_kib_field(const char *path, const char *field) {
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    char line[256], want[64];
    snprintf(want, sizeof want, "%s: %%lld kB", field);
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, want, &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}

/* One unsigned number from file dir/name; -1 when unreadable or "max" (no limit). */
static int read_count(const char *dir, const char *name, uint64_t *out) {
    char path[4200], text[64];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    char *end;
    unsigned long long v = ok ? strtoull(text, &end, 10) : 0;
    if (!ok || end == text) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* The cgroup's headroom, limit - usage: cgroup v2 (the "0::" line: memory.max, memory.current)
 * or v1 (the "memory" controller's line: memory.limit_in_bytes, memory.usage_in_bytes; an
 * unlimited v1 limit reads as a huge number, never the smaller figure).  -1 without one. */
static int cgroup_headroom(uint64_t *bytes) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    char line[4096], dir[4200] = "";
    const char *limit = NULL, *usage = NULL;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        const char *v1 = strstr(line, ":memory:");
        if (!strncmp(line, "0::", 3) && !limit) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", line + 3);
            limit = "memory.max", usage = "memory.current";
        } else if (v1) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", v1 + 8);
            limit = "memory.limit_in_bytes", usage = "memory.usage_in_bytes";
        }
    }
    fclose(f);
    uint64_t max, current;
    if (!limit || read_count(dir, limit, &max) || read_count(dir, usage, &current)) return -1;
    *bytes = max > current ? max - current : 0;
    return 0;
}

int host_memory_available(uint64_t *bytes, const char **source, errbuf *err) {
    const fault *fake = fault_get(FAULT_HOST_MEMORY, -1);
    if (fake) {
        *bytes = (uint64_t)fake->n;
        *source = "FSDP_FAULTS host_memory";
        return 0;
    }
    uint64_t cg;
    long long meminfo = proc_kib_field("/proc/meminfo", "MemAvailable");
    uint64_t avail = meminfo < 0 ? 0 : (uint64_t)meminfo;
    int have_avail = meminfo >= 0, have_cg = cgroup_headroom(&cg) == 0;
    if (!have_avail && !have_cg) return errf(err, "neither /proc/meminfo's MemAvailable nor a cgroup limit can be read");
    if (have_cg && (!have_avail || cg < avail)) {
        *bytes = cg;
        *source = "the cgroup's memory limit";
    } else {
        *bytes = avail;
        *source = "MemAvailable";
    }
    return 0;
}
