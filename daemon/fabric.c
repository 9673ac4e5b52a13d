/* fabric: see fabric.h. */
#include "daemon/fabric.h"

#include <dirent.h>
#include <limits.h>
#include <dlfcn.h>
#include <libgen.h>
#include <rdma/fabric.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fault.h"
#include "base/fileio.h"
#include "daemon/log.h"

static const char *probe_root(void) {
    const fault *f = fault_get(FAULT_FABRIC_ROOT, -1);
    return f ? f->path : "";
}

static void append(char *list, size_t n, const char *item) {
    size_t at = strlen(list);
    snprintf(list + at, n - at, "%s%s", at ? " " : "", item);
}

/* The first line of a small sysfs file, "" when it cannot be read. */
static void read_line(const char *path, char *out, size_t n) {
    char *text;
    errbuf ignored;
    out[0] = '\0';
    if (file_read_all(path, 256, &text, NULL, &ignored)) return;
    snprintf(out, n, "%.*s", (int)strcspn(text, "\n"), text);
    free(text);
}

/* ROOT/sys/class/infiniband: EFA devices by their driver, the rest as InfiniBand/RoCE. */
static void probe_devices(fabric_found *f, const char *root) {
    char dir[PATH_BYTES];
    snprintf(dir, sizeof dir, "%s/sys/class/infiniband", root);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char link[PATH_BYTES], target[PATH_BYTES], state[64], item[NAME_MAX + 80];
        if (snprintf(link, sizeof link, "%s/%s/device/driver", dir, e->d_name) >= (int)sizeof link) continue;
        ssize_t len = readlink(link, target, sizeof target - 1);
        target[len > 0 ? len : 0] = '\0';
        if (!strcmp(basename(target), "efa")) {
            append(f->efa, sizeof f->efa, e->d_name);
            continue;
        }
        if (snprintf(link, sizeof link, "%s/%s/ports/1/state", dir, e->d_name) >= (int)sizeof link) continue;
        read_line(link, state, sizeof state); /* "4: ACTIVE" */
        const char *word = strchr(state, ' ');
        snprintf(item, sizeof item, "%s(%s)", e->d_name, word ? word + 1 : "unknown");
        append(f->ib, sizeof f->ib, item);
    }
    if (d) closedir(d);
}

typedef int (*getinfo_fn)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                          struct fi_info **);
typedef void (*freeinfo_fn)(struct fi_info *);

/* Whether a libfabric lists the efa provider (asked for every provider's endpoints). */
static int lists_efa(void *lib) {
    getinfo_fn getinfo = (getinfo_fn)dlsym(lib, "fi_getinfo");
    freeinfo_fn freeinfo = (freeinfo_fn)dlsym(lib, "fi_freeinfo");
    struct fi_info *info = NULL;
    if (!getinfo || !freeinfo || getinfo(FI_VERSION(1, 9), NULL, NULL, 0, NULL, &info) != 0) return 0;
    int efa = 0;
    for (struct fi_info *i = info; i && !efa; i = i->next)
        efa = i->fabric_attr && i->fabric_attr->prov_name && !strcmp(i->fabric_attr->prov_name, "efa");
    freeinfo(info);
    return efa;
}

static void probe_libfabric(fabric_found *f, const char *root) {
    char paths[3][PATH_BYTES];
    snprintf(paths[0], sizeof paths[0], "%s/opt/amazon/efa/lib64/libfabric.so.1", root);
    snprintf(paths[1], sizeof paths[1], "%s/opt/amazon/efa/lib/libfabric.so.1", root);
    snprintf(paths[2], sizeof paths[2], "libfabric.so.1");
    for (int i = 0; i < 3; i++) {
        void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) continue;
        if (snprintf(f->libfabric, sizeof f->libfabric, "%s", paths[i]) >= (int)sizeof f->libfabric) f->libfabric[0] = '\0';
        f->efa_provider = lists_efa(lib);
        dlclose(lib);
        return;
    }
}

/* Whether the library at path loads and is an NCCL net plugin. */
static int loads_plugin(const char *path) {
    static const char *const versions[] = {"ncclNet_v10", "ncclNet_v9", "ncclNet_v8", "ncclNet_v7"};
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    int ok = 0;
    for (int i = 0; i < 4 && !ok; i++) ok = dlsym(lib, versions[i]) != NULL;
    dlclose(lib);
    return ok;
}

static void probe_plugins(fabric_found *f, const char *root) {
    const char *named = getenv("NCCL_NET_PLUGIN");
    char cand[8][PATH_BYTES], names[8][32];
    int n = 0;
    if (named && *named && strcmp(named, "none")) {
        snprintf(cand[n], sizeof cand[n], strchr(named, '/') ? "%s" : "libnccl-net-%s.so", named);
        snprintf(names[n++], sizeof names[0], "%s", named);
    }
    static const char *const libs[] = {"lib64", "lib"};
    for (int l = 0; l < 2; l++) {
        snprintf(cand[n], sizeof cand[n], "%s/opt/amazon/ofi-nccl/%s/libnccl-net-ofi.so", root, libs[l]);
        snprintf(names[n++], sizeof names[0], "ofi");
        snprintf(cand[n], sizeof cand[n], "%s/opt/amazon/ofi-nccl/%s/libnccl-net.so", root, libs[l]);
        names[n++][0] = '\0';
    }
    snprintf(cand[n], sizeof cand[n], "libnccl-net-ofi.so");
    snprintf(names[n++], sizeof names[0], "ofi");
    snprintf(cand[n], sizeof cand[n], "libnccl-net.so");
    names[n++][0] = '\0';
    for (int i = 0; i < n; i++)
        if (loads_plugin(cand[i])) {
            if (snprintf(f->plugin, sizeof f->plugin, "%s", cand[i]) >= (int)sizeof f->plugin) continue;
            snprintf(f->plugin_name, sizeof f->plugin_name, "%s", names[i]);
            return;
        }
}

int fabric_probe(fabric_found *f, errbuf *err) {
    (void)err;
    memset(f, 0, sizeof *f);
    const char *root = probe_root();
    probe_devices(f, root);
    probe_libfabric(f, root);
    probe_plugins(f, root);
    return 0;
}

const char *fabric_kind(const fabric_found *f) {
    return f->efa[0] || f->efa_provider ? "efa" : f->ib[0] ? "ib" : "none";
}

void fabric_describe(const fabric_found *f, char *out, size_t n) {
    snprintf(out, n, "EFA devices: %s; InfiniBand/RoCE devices: %s; libfabric: %s%s; NCCL net plugin: %s",
             f->efa[0] ? f->efa : "none", f->ib[0] ? f->ib : "none", f->libfabric[0] ? f->libfabric : "none",
             f->efa_provider ? " (efa provider)" : "", f->plugin[0] ? f->plugin : "none");
}

/* name=value unless the user set name; logged. */
static int set_default(const char *name, const char *value, const char *because, errbuf *err) {
    if (getenv(name)) return 0;
    if (setenv(name, value, 0) != 0) return errf(err, "setenv %s: out of memory", name);
    log_event(-1, "fabric: %s=%s (%s)", name, value, because);
    return 0;
}

/* DIR of a library path first in LD_LIBRARY_PATH (a bare name: nothing to add). */
static int prepend_library_dir(const char *lib, errbuf *err) {
    if (!strchr(lib, '/')) return 0;
    char dir[PATH_BYTES], value[2 * PATH_BYTES + 2];
    snprintf(dir, sizeof dir, "%s", lib);
    const char *old = getenv("LD_LIBRARY_PATH");
    snprintf(value, sizeof value, "%s%s%s", dirname(dir), old && *old ? ":" : "", old ? old : "");
    if (old && strstr(old, dir)) return 0;
    if (setenv("LD_LIBRARY_PATH", value, 1) != 0) return errf(err, "setenv LD_LIBRARY_PATH: out of memory");
    log_event(-1, "fabric: LD_LIBRARY_PATH starts with %s (for %s)", dir, lib);
    return 0;
}

int fabric_setenv(const fabric_found *f, int require, const char *nccl_log_dir, errbuf *err) {
    int efa = !strcmp(fabric_kind(f), "efa");
    if (efa && !f->plugin[0] && require)
        return errf(err, "EFA is present (%s) but no NCCL net plugin loads (libnccl-net-ofi.so under "
                    "/opt/amazon/ofi-nccl/lib*, libnccl-net.so): NCCL would fall back to TCP sockets. "
                    "Install aws-ofi-nccl, or set fabric.require=false", f->efa[0] ? f->efa : "efa provider");
    int rc = 0;
    if (f->plugin[0]) {
        if (f->plugin_name[0]) rc = set_default("NCCL_NET_PLUGIN", f->plugin_name, f->plugin, err);
        if (rc == 0) rc = prepend_library_dir(f->plugin, err);
    }
    if (rc == 0 && efa) {
        rc = set_default("FI_PROVIDER", "efa", "EFA devices", err);
        if (rc == 0) rc = set_default("FI_EFA_USE_DEVICE_RDMA", "1", "EFA devices", err);
        if (rc == 0) rc = set_default("FI_EFA_FORK_SAFE", "1", "EFA devices; fsdpd forks its workers", err);
        if (rc == 0 && f->libfabric[0]) rc = prepend_library_dir(f->libfabric, err);
    }
    if (rc == 0 && nccl_log_dir[0] && !getenv("NCCL_DEBUG")) {
        char file[PATH_BYTES + 32];
        snprintf(file, sizeof file, "%s/nccl-%%h-%%p.log", nccl_log_dir);
        rc = file_mkdir_p(nccl_log_dir, err);
        if (rc == 0) rc = set_default("NCCL_DEBUG", "INFO", "to read the transport NCCL chooses", err);
        if (rc == 0) rc = set_default("NCCL_DEBUG_SUBSYS", "INIT,NET", "the same", err);
        if (rc == 0) rc = set_default("NCCL_DEBUG_FILE", file, "one file a worker", err);
    }
    return rc;
}
