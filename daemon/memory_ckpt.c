/* memory_ckpt: in-memory checkpoints.  See memory_ckpt.h. */
#include "daemon/memory_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>
#include <sys/statvfs.h>

#include "base/fileio.h"
#include "base/path.h"
#include "daemon/host_memory.h"
#include "daemon/log.h"
#include "proto/ckpt.h"
#include "proto/lora_layout.h"
#include "proto/model_layout.h"

#define MEMORY_ROOT "/dev/shm"

static int manifest_path(const job_config *job, char *out, size_t n, errbuf *err) {
    return path_join(out, n, job->checkpoint.dir, CKPT_MEMORY_MANIFEST, err);
}

int memory_ckpt_open(const job_config *job, int slurm_node, char *out, size_t n, errbuf *err) {
    out[0] = '\0';
    if (job->checkpoint.memory_interval_steps == 0) return 0;
    char parent[PATH_BYTES], name[128], manifest[PATH_BYTES];
    const char *job_id = getenv("SLURM_JOB_ID");
    if (job_id && job_id[0]) snprintf(name, sizeof name, "%.64s-n%d", job_id, slurm_node);
    else snprintf(name, sizeof name, "local-%d-n%d", (int)getpid(), slurm_node);
    snprintf(parent, sizeof parent, "%s/fsdpd-%u", MEMORY_ROOT, (unsigned)geteuid());
    if (file_private_dir(parent, 1, err) || path_join(out, n, parent, name, err) || file_remove_tree(out, err) ||
        file_private_dir(out, 1, err))
        return errprefix(err, "checkpoint.memory_interval_steps (in-memory checkpoints; 0 turns them off)");
    /* An earlier launch's manifest names memory that is gone. */
    if (slurm_node == 0 && (manifest_path(job, manifest, sizeof manifest, err) ||
                            (unlink(manifest) != 0 && errno != ENOENT && errf(err, "%s: %s", manifest, strerror(errno)))))
        return -1;
    log_event(-1, "in-memory checkpoints every %d step%s at most, in %s", job->checkpoint.memory_interval_steps,
              job->checkpoint.memory_interval_steps == 1 ? "" : "s", out);
    return 0;
}

void memory_ckpt_close(const char *dir) {
    errbuf err;
    if (dir[0] && file_remove_tree(dir, &err)) log_event(-1, "%s", err.msg);
}

/* The memory manifest, parsed; 1 when there is none. */
static int load_manifest(const job_config *job, ckpt_manifest *m, errbuf *err) {
    char path[PATH_BYTES];
    char *text;
    size_t len;
    if (manifest_path(job, path, sizeof path, err)) return -1;
    if (access(path, F_OK) != 0 && errno == ENOENT) return 1;
    if (file_read_all(path, CKPT_MANIFEST_MAX, &text, &len, err)) return -1;
    int rc = ckpt_manifest_parse(m, text, len, path, err);
    free(text);
    return rc;
}

/* Which image of each of this node's ranks (node of the run, `workers` a node) holds the
 * manifest's step, checked against it (size, header, header CRC): 0 when every rank has one,
 * slot[] then says which (-1 for the ranks past the manifest's files). */
static int find_images(const ckpt_manifest *m, const char *dir, int node, int workers, int slot[], errbuf *err) {
    ckpt_manifest one = *m; /* its files[] swapped for a copy: a name changed per image */
    ckpt_file_entry *files = malloc((size_t)m->layout.n_files * sizeof *files);
    if (!files) return errf(err, "out of memory");
    memcpy(files, m->files, (size_t)m->layout.n_files * sizeof *files);
    one.files = files;
    int rc = 0;
    for (int k = 0; rc == 0 && k < workers; k++) {
        int r = node * workers + k;
        slot[k] = -1;
        if (r >= m->layout.n_files) continue;
        errbuf first;
        for (int i = 0; slot[k] < 0 && i < 2; i++) {
            if (ckpt_memory_file_name(files[r].name, sizeof files[r].name, r, m->layout.n_files, i)) break;
            if (ckpt_verify_file(dir, &one, r, 0, i ? err : &first) == 0) slot[k] = i;
        }
        if (slot[k] < 0) rc = errprefix(err, "%s", first.msg);
    }
    free(files);
    return rc;
}

int64_t memory_ckpt_held(const job_config *job, const char *dir, int node, int workers, int world) {
    if (!dir[0]) return -1;
    ckpt_manifest m;
    errbuf err;
    int rc = load_manifest(job, &m, &err);
    if (rc) {
        if (rc < 0) log_event(-1, "no in-memory checkpoint to resume: %s", err.msg);
        return -1;
    }
    int64_t step = m.step;
    int *slot = malloc((size_t)workers * sizeof *slot);
    if (!slot) rc = errf(&err, "out of memory");
    else if (m.world_size != world || m.layout.n_files != world)
        rc = errf(&err, "it was written by %d ranks (%d files), this run has %d", m.world_size, m.layout.n_files,
                  world);
    else rc = find_images(&m, dir, node, workers, slot, &err);
    if (rc) log_event(-1, "the in-memory checkpoint of step %lld is not whole on this node: %s", (long long)step,
                      err.msg);
    free(slot);
    ckpt_manifest_free(&m);
    return rc ? -1 : step;
}

/* Every rank's image of the step under its file's own name (the other image, if any, under
 * the second name). */
static int name_images(const ckpt_manifest *m, const char *dir, int node, int workers, const int slot[], errbuf *err) {
    for (int k = 0; k < workers; k++) {
        char second[CKPT_NAME_MAX], a[PATH_BYTES], b[PATH_BYTES];
        int r = node * workers + k;
        if (slot[k] != 1) continue;
        if (ckpt_memory_file_name(second, sizeof second, r, m->layout.n_files, 1) ||
            path_join(a, sizeof a, dir, m->files[r].name, err) || path_join(b, sizeof b, dir, second, err))
            return errf(err, "%s: path too long", dir);
        if (renameat2(AT_FDCWD, b, AT_FDCWD, a, RENAME_EXCHANGE) != 0)
            return errf(err, "exchanging %s and %s: %s", b, a, strerror(errno));
    }
    return 0;
}

int memory_ckpt_prepare_resume(const job_config *job, const char *dir, int64_t step, int node, errbuf *err) {
    ckpt_manifest m;
    char *text = NULL, path[PATH_BYTES];
    int workers = job->runtime.workers_per_node;
    int rc = load_manifest(job, &m, err);
    if (rc > 0) return errf(err, "the memory manifest %s is gone", CKPT_MEMORY_MANIFEST);
    if (rc) return -1;
    int *slot = malloc((size_t)workers * sizeof *slot);
    if (!slot) rc = errf(err, "out of memory");
    else if (m.step != step)
        rc = errf(err, "the memory manifest is of step %lld, not of the planned step %lld", (long long)m.step,
                  (long long)step);
    if (rc == 0) rc = find_images(&m, dir, node, workers, slot, err);
    if (rc == 0) rc = name_images(&m, dir, node, workers, slot, err);
    if (rc == 0) rc = ckpt_manifest_to_json(&m, &text, err);
    if (rc == 0) rc = path_join(path, sizeof path, dir, CKPT_MANIFEST, err);
    if (rc == 0) {
        file_chunk chunks[] = {{text, strlen(text)}, {"\n", 1}};
        rc = file_write_atomic(path, chunks, 2, err);
    }
    free(text);
    free(slot);
    ckpt_manifest_free(&m);
    return rc ? errprefix(err, "resuming from memory") : 0;
}

/* The bytes of one image of the largest shard file (file 0's: the padding falls last), as
 * ckpt_plan lays it out for the trained units (the model's, or the adapters'). */
static int image_bytes(const job_config *job, const llama_config *cfg, int n_files, uint64_t *out, errbuf *err) {
    llama_layout lo;
    lora_layout la;
    ckpt_layout cl;
    ckpt_file_header h;
    int full = job->train.type == JOB_TRAIN_FULL, rc = llama_layout_init(&lo, cfg, err);
    if (rc) return -1;
    if (!full && lora_layout_init(&la, cfg, &job->lora.config, err)) {
        llama_layout_free(&lo);
        return -1;
    }
    rc = full ? ckpt_layout_from_slots(&cl, n_files, lo.units, lo.n_units, lo.tensors, lo.n_tensors, err)
              : ckpt_layout_from_slots(&cl, n_files, la.units, la.n_units, la.tensors, la.n_tensors, err);
    if (rc == 0 && (rc = ckpt_plan(&h, &cl, 0, 0, err)) == 0) {
        *out = h.file_bytes;
        ckpt_file_header_free(&h);
    }
    if (rc == 0) ckpt_layout_free(&cl);
    if (!full) lora_layout_free(&la);
    llama_layout_free(&lo);
    return rc;
}

/* The bytes dir's files hold now (a restart's images, counted as free: they are reused). */
static uint64_t held_bytes(const char *dir) {
    uint64_t n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            n += (uint64_t)st.st_blocks * 512;
    }
    if (d) closedir(d);
    return n;
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

int memory_ckpt_slots(const job_config *job, const llama_config *cfg, const char *dir, int world, int *slots,
                      errbuf *err) {
    *slots = 0;
    if (!dir[0]) return 0;
    int files = ckpt_n_files(job, world), workers = job->runtime.workers_per_node;
    int mine = files < workers ? files : workers; /* node 0 has the most */
    uint64_t each, host;
    const char *source;
    struct statvfs fs;
    if (image_bytes(job, cfg, files, &each, err) || host_memory_available(&host, &source, err))
        return errprefix(err, "planning the in-memory checkpoints");
    if (statvfs(dir, &fs) != 0) return errf(err, "%s: statvfs: %s", dir, strerror(errno));
    uint64_t tmpfs = (uint64_t)fs.f_bavail * fs.f_frsize + held_bytes(dir), node = (uint64_t)mine * each;
    uint64_t have = tmpfs < host + held_bytes(dir) ? tmpfs : host + held_bytes(dir);
    *slots = 2 * node <= have / 4 ? 2 : node <= have / 2 ? 1 : 0;
    if (*slots)
        log_event(-1, "in-memory checkpoints: %d image%s a rank, %.2f GiB on this node (%d rank%s x %.3f GiB%s); "
                      "%.1f GiB free for them (%s, and %s)", *slots, *slots == 1 ? "" : "s", gib(*slots * node), mine,
                  mine == 1 ? "" : "s", gib(each), *slots == 1 ? ": one image, so a failure during a save leaves none" : "",
                  gib(have), source, dir);
    else
        log_event(-1, "in-memory checkpoints: none on this node: its ranks' images (%.2f GiB) would take more than half "
                      "of the %.1f GiB free for them (%s, and %s); a restart resumes from disk",
                  gib(node), gib(have), source, dir);
    return 0;
}
