/* memory_ckpt: in-memory checkpoints (F48; checkpoint.memory_interval_steps).
 *
 * Each node keeps its ranks' newest saved state in its own memory, so that a run restarted
 * inside the job (runtime.max_restarts, runtime.spare_nodes) resumes from the step before the
 * failure instead of the last checkpoint on disk.
 *
 * The images.  For the launch, a node's fsdpd holds two anonymous memory files (memfd, like
 * the model's: not bound by /dev/shm's size, and gone with the last process holding them, so
 * a killed fsdpd leaves nothing behind) for each of its worker places, "fsdpd-ckpt-wK.S".
 * Every run's workers inherit all of the node's (worker k's image s at fd first + 2k + s:
 * msg_config.memory_fd).  A rank maps its own as the image of its saves
 * (worker/ckpt_writer.h): a shard file in place, unsealed while a save overwrites it and
 * sealed after; with two, a save overwrites the one holding the older step, so a rank killed
 * while it saves keeps the newer.  The images outlive the worker: a restarted rank reads its
 * state back from them (and from the node's others when its files are theirs: no_shard,
 * hybrid_shard on one node).
 *
 * The manifest.  The leader's coordinator writes CKPT/memory-manifest.json (proto/ckpt.h) for
 * the newest step every rank sealed; a launch's first run removes any earlier one.
 *
 * The resume.  A node holds a step for a run (memory_ckpt_held) when the memory manifest's
 * world is the run's and each file of its ranks is whole in one of the images of the rank
 * that writes it (size, step, header and its CRC against the manifest).  A restart resumes
 * from memory only when every node holds the same step (msg_join.memory_step), at least as
 * new as `latest` on disk (daemon/ckpt_commit.h), else from disk as before.  A node whose
 * fsdpd is gone takes its memory with it: with spare nodes, every node copies its images to
 * them (daemon/replica.h) and the spare in its place adopts its copy.  What it cannot cover: a
 * smaller world (runtime.allow_shrink: the files would need re-slicing), a lost node without a
 * spare holding its copy, a rank killed between staging and sealing a save when it keeps one
 * image, a failure of the leader (the requeue path): then the disk. */
#ifndef FSDP_MEMORY_CKPT_H
#define FSDP_MEMORY_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/model_config.h"

typedef struct memory_images {
    int workers; /* this node's worker places */
    int *fd;     /* [2 * workers]: place k's image s at fd[2k + s]; NULL when off */
} memory_images;

/* The node's images (none when checkpoint.memory_interval_steps is 0); the leader (SLURM
 * node 0) removes an earlier launch's memory manifest, and its own when fsdpd exits. */
int memory_ckpt_open(const job_config *job, int slurm_node, int workers, memory_images *out, errbuf *err);
void memory_ckpt_close(memory_images *im);

/* How many images of `bytes` each (all of a node's, or all a spare takes) fit in `have` bytes
 * of free memory: 2 when twice fit in half, 1 when once fits in 80% (one image is what a disk
 * save stages into anyway), else 0. */
int memory_ckpt_images_fit(uint64_t bytes, uint64_t have);
/* How many images each rank keeps this run (*slots): 2 when twice the images of the node's
 * ranks fit in half the memory the node has free (the images it holds already counted as
 * free), 1 when once fits in 80% of it (one image is what a disk save stages into anyway: it
 * replaces that buffer), else 0 (off on this node: the other nodes' never complete, a restart
 * resumes from disk); logged.  0 without images. */
int memory_ckpt_slots(const job_config *job, const llama_config *cfg, const memory_images *im, int world,
                      int *slots, errbuf *err);

/* The step of the memory manifest when this node (node of a run of `world` ranks) holds each
 * file of its ranks whole; -1 (why logged) when not, or when there is no memory manifest. */
int64_t memory_ckpt_held(const job_config *job, const memory_images *im, int node, int world);
/* The same, as a check that the node holds `step`: 0, or -1 with why. */
int memory_ckpt_check(const job_config *job, const memory_images *im, int node, int world, int64_t step,
                      errbuf *err);

#endif
