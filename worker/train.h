/* train: the training loop of one worker — data, model, FSDP steps, learning-rate
 * schedule, checkpoint triggers — independent of how the worker talks to its daemon (hooks
 * carry that).
 *
 * Checkpoints (with a writer): a save follows the optimizer step `s` when
 *   - s is the last step (synchronous: it first waits for a save still being written), or
 *   - s is a multiple of checkpoint.interval_steps, or
 *   - a checkpoint was requested (hooks.ckpt_request returned a new id) on any rank,
 * decided by every rank alike from the votes all-gathered with the step's statistics
 * (fsdp.vote).  While a rank still writes an async save, a save due is skipped on every rank:
 * an interval save is lost (the next interval tries again), a request stays pending until a
 * step where no rank writes.  A job resumed from a checkpoint starts after its step.
 *
 * In-memory checkpoints (a writer with a memory directory, daemon/memory_ckpt.h): after a
 * step with no disk save, a memory save follows when checkpoint.memory_interval_steps steps
 * have passed since the last save of any kind and, on some rank, the copy that last stalled
 * training (the staging) would stay within 1% of the time since (so a large state is saved
 * less often than the interval says: the pace adapts to its cost), unless a rank still seals
 * or writes.  Every save, disk or memory, refreshes the memory image. */
#ifndef FSDP_TRAIN_H
#define FSDP_TRAIN_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "proto/job.h"
#include "proto/msg.h"
#include "proto/model_config.h"
#include "worker/comm.h"
#include "worker/fsdp_pref.h"

typedef struct train_step_info {
    long step, total_steps;   /* step counts from 1 */
    double loss, lr, grad_norm;
    int64_t tokens;           /* unmasked targets of the global batch */
    double seconds;           /* wall time of the step */
    /* For the stragglers' watch (daemon/straggler.h): the iteration from the loop's top to the
     * step's end, of it the time in collectives (comm_busy_s) and in filling the batch. */
    double iter_s, comm_s, data_s;
    long layer_forwards;      /* decoder-layer forwards so far on this rank */
    long all_gathers;         /* units all-gathered so far on this rank (fsdp.param_gathers) */
    long replica_collectives; /* collectives on the replica communicator so far (hybrid_shard) */
    int64_t gathered_bytes;   /* bytes sent into all-gathers on the shard communicator so far */
    int64_t mem_bytes, mem_peak_bytes; /* this rank's context memory (k_bytes_in_use, k_peak_bytes) */
    int64_t tokens_seen;      /* unmasked targets trained on, whole job, resumed runs included */
    int has_eval;             /* an evaluation followed this step (train.eval_interval, the last) */
    double eval_loss;         /* its mean token loss over the held-out samples */
    int objective;            /* job_objective: with dpo or orpo, pref holds the step's figures */
    double pref[PREF_STATS];  /* worker/fsdp_pref.h's, means over the global batch's pairs */
    /* The checkpoint this step triggers, announced before it is written: */
    int ckpt;                 /* train_ckpt_action */
    int ckpt_attempt;
    int64_t ckpt_request;     /* requests up to this id are served by it */
} train_step_info;

typedef enum train_ckpt_action {
    TRAIN_CKPT_NONE, TRAIN_CKPT_ASYNC, TRAIN_CKPT_SYNC, TRAIN_CKPT_SKIPPED,
    TRAIN_CKPT_MEMORY /* into the node's memory alone (checkpoint.memory_interval_steps) */
} train_ckpt_action;

enum { TRAIN_STOP = 1, TRAIN_STOP_SAVE = 2 }; /* should_stop's answers (0: go on) */

typedef struct train_hooks {
    void *arg;
    /* After every optimizer step. */
    void (*on_step)(void *arg, const train_step_info *info);
    /* After each unit of training work: the loop's start, each step, each evaluation batch,
     * the sample replies, a save (the daemon's stall watch, runtime.stall_timeout_s).  NULL:
     * none. */
    void (*on_progress)(void *arg);
    /* Polled before every step and voted: when it is non-zero on any rank, every rank stops
     * cleanly after that step; TRAIN_STOP_SAVE on any rank: after a synchronous checkpoint of
     * that step (SIGTERM: no save left in the background, no step after it). */
    int (*should_stop)(void *arg);
    /* Polled before every step: the newest checkpoint request this rank has received (ids
     * increase; 0: none).  NULL: never. */
    int64_t (*ckpt_request)(void *arg);
    /* The newest request that asked for a synchronous save (0: none; NULL: never): a request
     * served with one of these saves synchronously whatever checkpoint.async says. */
    int64_t (*ckpt_sync_request)(void *arg);
    /* Rank 0: the greedy reply to sample prompt `prompt` after step `step` (train.sample_prompts),
     * ids[n], and why it ended (gen_stop_name).  NULL: not reported. */
    int (*on_sample)(void *arg, long step, int prompt, const int32_t *ids, int n, const char *stop);
} train_hooks;

struct ckpt_writer;

typedef struct train_env {
    const job_config *job; /* validated */
    const llama_config *model; /* the model's config, as fsdpd read it */
    int rank, world;
    comm *comm;            /* NULL when world is 1 */
    comm *shard_comm, *replica_comm; /* hybrid_shard over several nodes: this node's ranks and
                                        this local rank of every node; NULL otherwise */
    kctx *ctx;
    train_hooks hooks;
    struct ckpt_writer *writer; /* NULL: no checkpoints */
    int ckpt_attempt;           /* in partial directory names (proto/ckpt.h) */
    const char *resume_dir;     /* a committed checkpoint to start from, or NULL */
    /* Resuming from the node's in-memory images (daemon/memory_ckpt.h) instead: place k's
     * image s at fd + 2k + s (fd -1: not), the node's `workers` places, this rank's node; the
     * manifest is resume_dir's memory manifest. */
    struct {
        int fd, workers, node;
    } memory;
    int model_fd;               /* fsdpd's model image (proto/model_image.h), when not resuming */
    /* train.sample_prompts as token ids and the stop ids (NULL: none): every rank generates
     * the replies together (fsdp_generate) every train.sample_every steps, else at each
     * evaluation or with none at the end, and after the last step. */
    const msg_sample_prompts *samples;
} train_env;

/* train_run's failure to load the model, the checkpoint or the data: a restart would fail
 * alike. */
#define TRAIN_ERR_SETUP (-2)

/* Runs the job's steps.  Returns 0 when every step ran (or a stop was requested),
 * TRAIN_ERR_SETUP or -1 with the reason (naming the step and rank for a non-finite loss or
 * gradient norm) otherwise.  With resume_dir the model, optimizer state, step and token
 * count come from that checkpoint (its global_batch and seed must be the job's: fsdpd sets
 * them from the manifest).
 *
 * Fault points (base/fault.h): nan_loss=RANK:STEP makes that rank's loss NaN at that step;
 * nan_grad=RANK:STEP makes one element of its gradient NaN (the loss stays finite: the
 * gradient norm is what stops the job); final_params=PATH makes rank 0 write the final
 * parameters (gathered, fp32) to PATH as safetensors. */
int train_run(const train_env *env, errbuf *err);

#endif
