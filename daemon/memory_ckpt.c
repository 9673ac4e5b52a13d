/* memory_ckpt: in-memory checkpoints.  See memory_ckpt.h. */
#include "daemon/memory_ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/path.h"
#include "daemon/host_memory.h"
#include "daemon/log.h"
#include "proto/ckpt.h"
#include "proto/lora_layout.h"
#include "proto/model_layout.h"

static int manifest_path(const job_config *job, char *out, size_t n, errbuf *err) {
    return path_join(out, n, job->checkpoint.dir, CKPT_MEMORY_MANIFEST, err);
}

/* The leader's memory manifest, removed at its exit: it names memory that goes with the
 * processes (a kill leaves it, and the next launch's leader removes it). */
static char manifest_at_exit[PATH_BYTES];
static void remove_manifest(void) { unlink(manifest_at_exit); }

int memory_ckpt_open(const job_config *job, int slurm_node, int workers, memory_images *out, errbuf *err) {
    *out = (memory_images){.workers = workers};
    if (job->checkpoint.memory_interval_steps == 0) return 0;
    char manifest[PATH_BYTES];
    /* An earlier launch's manifest names memory that is gone. */
    if (slurm_node == 0 && (manifest_path(job, manifest, sizeof manifest, err) ||
                            (unlink(manifest) != 0 && errno != ENOENT && errf(err, "%s: %s", manifest, strerror(errno)))))
        return -1;
    if (slurm_node == 0) {
        snprintf(manifest_at_exit, sizeof manifest_at_exit, "%s", manifest);
        atexit(remove_manifest);
    }
    out->fd = malloc((size_t)(2 * workers) * sizeof *out->fd);
    if (!out->fd) return errf(err, "out of memory");
    for (int i = 0; i < 2 * workers; i++) out->fd[i] = -1;
    for (int i = 0; i < 2 * workers; i++) {
        char name[64];
        snprintf(name, sizeof name, "fsdpd-ckpt-w%d.%d", i / 2, i % 2);
        if ((out->fd[i] = memfd_create(name, MFD_CLOEXEC)) < 0) {
            int e = errno;
            memory_ckpt_close(out);
            return errf(err, "checkpoint.memory_interval_steps: memfd_create: %s", strerror(e));
        }
    }
    log_event(-1, "in-memory checkpoints every %d step%s at most", job->checkpoint.memory_interval_steps,
              job->checkpoint.memory_interval_steps == 1 ? "" : "s");
    return 0;
}

void memory_ckpt_close(memory_images *im) {
    for (int i = 0; im->fd && i < 2 * im->workers; i++)
        if (im->fd[i] >= 0) close(im->fd[i]);
    free(im->fd);
    im->fd = NULL;
}

/* ---- how many images ---- */

/* The bytes of one image of the largest shard file (file 0's: the padding falls last), as
 * ckpt_plan lays it out for the trained units (the model's, or the adapters'). */
static int image_bytes(const job_config *job, const llama_config *cfg, int n_files, uint64_t *out, errbuf *err) {
    llama_layout lo;
    lora_layout la;
    ckpt_layout cl;
    ckpt_file_header h;
    int full = job->train.type == JOB_TRAIN_FULL;
    if (llama_layout_init(&lo, cfg, err)) return -1;
    if (!full && lora_layout_init(&la, cfg, &job->lora.config, err)) {
        llama_layout_free(&lo);
        return -1;
    }
    int rc = full ? ckpt_layout_from_slots(&cl, n_files, lo.units, lo.n_units, lo.tensors, lo.n_tensors, err)
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

/* The memory the node's images hold now (a restart's: they are reused). */
static uint64_t held_bytes(const memory_images *im) {
    uint64_t n = 0;
    for (int i = 0; i < 2 * im->workers; i++) {
        struct stat st;
        if (fstat(im->fd[i], &st) == 0) n += (uint64_t)st.st_blocks * 512;
    }
    return n;
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

int memory_ckpt_images_fit(uint64_t bytes, uint64_t have) {
    return 4 * bytes <= have ? 2 : 5 * bytes <= 4 * have ? 1 : 0;
}

int memory_ckpt_slots(const job_config *job, const llama_config *cfg, const memory_images *im, int world,
                      int *slots, errbuf *err) {
    *slots = 0;
    if (!im->fd || job->checkpoint.memory_interval_steps == 0) return 0;
    int files = ckpt_n_files(job, world), mine = files < im->workers ? files : im->workers; /* node 0's */
    uint64_t each, have;
    const char *source;
    if (image_bytes(job, cfg, files, &each, err) || host_memory_available(&have, &source, err))
        return errprefix(err, "planning the in-memory checkpoints");
    uint64_t node = (uint64_t)mine * each;
    have += held_bytes(im);
    *slots = memory_ckpt_images_fit(node, have);
    if (*slots)
        log_event(-1, "in-memory checkpoints: %d image%s a rank, %.3f GiB on this node (%d rank%s x %.3f GiB); "
                      "%.1f GiB free (%s)%s", *slots, *slots == 1 ? "" : "s", gib((uint64_t)*slots * node), mine,
                  mine == 1 ? "" : "s", gib(each), gib(have), source,
                  *slots == 1 ? ": one image, so a rank that fails while it saves leaves the disk to resume from" : "");
    else
        log_event(-1, "in-memory checkpoints: none on this node: its ranks' images (%.2f GiB) would take more than 80%% "
                      "of the %.1f GiB free (%s); a restart resumes from disk", gib(node), gib(have), source);
    return 0;
}

/* ---- what a node holds ---- */

/* Each file of this node's ranks (node of the run) is whole in one image of the place that
 * writes it (rank f writes file f). */
static int check_images(const ckpt_manifest *m, const memory_images *im, int node, errbuf *err) {
    for (int k = 0; k < im->workers && node * im->workers + k < m->layout.n_files; k++)
        if (ckpt_find_image(im->fd + 2 * k, m, node * im->workers + k, err) < 0) return -1;
    return 0;
}

/* The memory manifest checked against this node's images: 0 (*m loaded), 1 when there is
 * none, -1 (err). */
static int load_held(const job_config *job, const memory_images *im, int node, int world, ckpt_manifest *m,
                     errbuf *err) {
    char path[PATH_BYTES];
    if (!im->fd) return 1;
    if (manifest_path(job, path, sizeof path, err)) return -1;
    if (access(path, F_OK) != 0 && errno == ENOENT) return 1;
    if (ckpt_manifest_load_file(m, path, err)) return -1;
    int rc = 0;
    if (m->world_size != world || m->layout.n_files != ckpt_n_files(job, world))
        rc = errf(err, "the in-memory checkpoint of step %lld was written by %d ranks (%d files), this run has %d",
                  (long long)m->step, m->world_size, m->layout.n_files, world);
    if (rc == 0 && check_images(m, im, node, err)) rc = errprefix(err, "the in-memory checkpoint of step %lld", (long long)m->step);
    if (rc) ckpt_manifest_free(m);
    return rc;
}

int64_t memory_ckpt_held(const job_config *job, const memory_images *im, int node, int world) {
    ckpt_manifest m;
    errbuf err;
    int rc = load_held(job, im, node, world, &m, &err);
    if (rc) {
        if (rc < 0) log_event(-1, "no in-memory checkpoint to resume on this node: %s", err.msg);
        return -1;
    }
    int64_t step = m.step;
    ckpt_manifest_free(&m);
    return step;
}

int memory_ckpt_check(const job_config *job, const memory_images *im, int node, int world, int64_t step,
                      errbuf *err) {
    ckpt_manifest m;
    int rc = load_held(job, im, node, world, &m, err);
    if (rc > 0) return errf(err, "no in-memory checkpoint on this node");
    if (rc) return -1;
    if (m.step != step)
        rc = errf(err, "the memory manifest is of step %lld, not of the planned step %lld", (long long)m.step,
                  (long long)step);
    ckpt_manifest_free(&m);
    return rc;
}
