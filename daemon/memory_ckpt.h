/* memory_ckpt: in-memory checkpoints (F48; checkpoint.memory_interval_steps).
 *
 * Each node keeps its ranks' newest saved state in its own memory, so that a run restarted
 * inside the job (runtime.max_restarts, runtime.spare_nodes) resumes from the step before the
 * failure instead of the last checkpoint on disk:
 *
 *     /dev/shm/fsdpd-UID/          private (file_private_dir: 0700, this uid's)
 *         JOB-nNODE/               this launch's node (JOB: SLURM_JOB_ID, or local-PID of a
 *                                  node run without SLURM; NODE: its SLURM node index)
 *             rank-RRRRR-of-FFFFF.bin   rank R's image (worker/ckpt_writer.h), mapped by the
 *                                  rank and sealed at each save: a shard file in place
 *             rank-RRRRR-of-FFFFF.bin.1 its second image, when it keeps two (a save overwrites
 *                                  the older: a rank killed while it saves keeps the newer)
 *             manifest.json        a copy of the memory manifest, made for a resume only
 *     CKPT/memory-manifest.json    the leader's manifest of the newest step every rank sealed
 *                                  (daemon/ckpt_commit.h), in the shared checkpoint.dir
 *
 * The images live in tmpfs, not in the workers: a rank killed between saves leaves its image
 * whole, and the restarted rank reads it back as a checkpoint directory (re-slicing is not
 * needed: a memory resume keeps the world and each node its ranks).  A node holds a step for
 * a run only when the memory manifest's world is the run's and every file of its ranks is
 * there with the manifest's size and header (memory_ckpt_held); a run resumes from memory
 * only when every node holds the same step, at least as new as `latest` on disk, else from
 * disk as before.  What a failure can cost: a rank killed while it copies a save into its
 * image (the image unsealed: daemon or disk), a node whose daemon is gone (its memory goes
 * with it; a spare in its place has none), a smaller world (runtime.allow_shrink): the disk.
 *
 * A launch starts by clearing its node's directory (and the leader the memory manifest) and
 * removes both when fsdpd exits. */
#ifndef FSDP_MEMORY_CKPT_H
#define FSDP_MEMORY_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/model_config.h"

/* The node's directory (above), made empty: its parent made or checked private; anything
 * an earlier launch left there removed.  Nothing when memory checkpoints are off ("" out). */
int memory_ckpt_open(const job_config *job, int slurm_node, char *out, size_t n, errbuf *err);
/* How many images each of this node's ranks keeps (*slots): 2 when twice the images of its
 * ranks fit in a quarter of what the node has free for them (its available memory and the
 * file system of dir, the images already there counted as free), 1 when once fits in half,
 * else 0 (memory checkpoints off on this node: the other nodes' never complete, a restart
 * resumes from disk); logged.  0 when dir is "". */
int memory_ckpt_slots(const job_config *job, const llama_config *cfg, const char *dir, int world, int *slots,
                      errbuf *err);
/* Removes the node's directory (fsdpd's exit). */
void memory_ckpt_close(const char *dir);

/* The step of the memory manifest when this node holds every file of its ranks (node of a
 * run of `world` ranks, `workers` a node) in dir, checked against it; -1 (why logged) when
 * not, or when there is no memory manifest. */
int64_t memory_ckpt_held(const job_config *job, const char *dir, int node, int workers, int world);
/* Makes dir a checkpoint directory to resume from for node `node` of the run: the memory
 * manifest copied into it (it must still be of `step`), each rank's image of the step under
 * the manifest's file name (rank-R-of-F.bin; the other image, if any, named .1). */
int memory_ckpt_prepare_resume(const job_config *job, const char *dir, int64_t step, int node, errbuf *err);

#endif
