/* ckpt_commit: fsdpd's checkpoint coordinator (DESIGN.md, Checkpoints; format in
 * proto/ckpt.h).
 *
 * Before the workers start (the leader holding checkpoint.dir's lock, daemon/ckpt_lock.h),
 * ckpt_prepare creates checkpoint.dir, removes partial directories left by earlier runs
 * (their writers are gone: no other job writes under the lock) and picks this run's attempt
 * number above theirs, then resolves checkpoint.resume: the checkpoint's manifest is read
 * and its global_batch and seed replace the job's (they are fixed for a job's life; a
 * change is logged), then checked: the job's model shapes, adapters of the job's shapes,
 * the job's identity (proto/ckpt.h's "identity": model or base fingerprint, training type
 * and adapter settings, tokenizer, data, optimizer and schedule; each difference logged
 * with both values, any but train.max_steps and train.epochs refuses the resume unless
 * checkpoint.resume is force), every file present with its size and a header matching the
 * manifest.  The committed steps after the one the run starts from (all of them for a
 * fresh start) move to superseded/step-N, logged: nothing committed is lost.  The workers
 * then load their own byte ranges, checking every section's CRC32C.
 *
 * During training the workers decide when to save (worker/train.h) and rank 0 announces
 * each save in its METRICS ("checkpoint": {"step", "attempt", "mode"}).  A save's deadline
 * starts when it is announced, or once the saves before it are written (a rank writes one
 * at a time).  The coordinator
 * opens a commit for it with a deadline of checkpoint.timeout_s and collects one CKPT_DONE
 * per shard file (ranks 0 .. n_files-1).  When all are in it writes manifest.json (tmp +
 * fsync + rename) into step-N.partial.A, checks every file's header against it, renames the
 * directory to step-N (swapping atomically with an existing step-N), fsyncs the parent,
 * points `latest` at it (a temporary symlink renamed over `latest`) and removes the oldest
 * committed checkpoints beyond checkpoint.keep.
 *
 * A commit that cannot finish — the deadline passes, or a rank reports a failed write — is
 * handled by the save's mode.  Async: abandoned; the ranks still writing get CKPT_ABORT, the
 * log names the late ranks, training goes on, and the partial directory is removed once
 * every writer has reported (aborted or not) or the job is over.  A failed async save is
 * retried once at once (a checkpoint request, served at the next step in the job's mode);
 * a failed retry counts one failed save, a commit resets the count, and
 * checkpoint.max_failed_saves consecutive ones stop the job (fatal_permanent), naming the
 * last error: a job must not train for hours unprotected.  Sync: a rank stuck in its
 * write would stall the next collective, so the job is stopped (the `fatal` hook) with the
 * reason.
 *
 * On request (ckpt_coord_request: SIGUSR1, the status socket) every worker gets CKPT_BEGIN
 * {"request": id}; the ranks save at the next step boundary where no rank is still writing.
 * A request to stop (SIGTERM) adds "stop": true: the ranks save synchronously after the step
 * they are in (once a save still being written is done) and stop after it. */
#ifndef FSDP_CKPT_COMMIT_H
#define FSDP_CKPT_COMMIT_H

#include <event2/event.h>
#include <jansson.h>

#include "base/errbuf.h"
#include "proto/ckpt.h"
#include "proto/job.h"
#include "proto/model_config.h"
#include "proto/msg.h"

/* What ckpt_prepare found. */
typedef struct ckpt_start {
    int attempt;                  /* this run's attempt number (partial directory names) */
    char resume_dir[JOB_PATH_MAX]; /* the checkpoint to resume from, "" for none */
    long long resume_step;
    int from_memory;              /* from the in-memory checkpoint (daemon/memory_ckpt.h) whose
                                   * manifest is resume_dir's (checkpoint.dir's) memory manifest */
    json_t *model_config;         /* the job's config.json object (new reference) */
    llama_config model;           /* the same, parsed: config.json is read here only */
    char base_fingerprint[ST_FINGERPRINT_HEX]; /* model.path's (st_model_fingerprint): the
                                                * frozen base's for adapter jobs */
    ckpt_identity identity;       /* the job's, for the manifests */
} ckpt_start;

/* Prepares checkpoint.dir and resolves the resume (see above); job's global_batch and seed
 * are set from the checkpoint's manifest.  The caller validates the job again.  On several
 * nodes only the leader prepares (it alone clears partial directories); the others adopt
 * its attempt and resume (ckpt_adopt: the model's config read, the checkpoint to resume
 * checked and its global_batch and seed taken, as here).  An adapter job's checkpoint must
 * hold adapters of the job's settings for the same base (its fingerprint, computed here);
 * a full fine-tune's must hold a whole model. */
/* An in-memory checkpoint every node of the run holds (daemon/memory_ckpt.h): its step (-1:
 * none) and this node's images.  ckpt_prepare resumes from it instead of disk when
 * checkpoint.resume is auto (every restart's) and it is at least as new as `latest`; ckpt_adopt
 * when the leader's plan says so.  Each checks this node's images again (memory_ckpt_check). */
struct memory_images;
typedef struct ckpt_memory {
    int64_t step;
    const struct memory_images *images; /* this node's */
    int node, world;                    /* this node's index in the run, the run's ranks */
} ckpt_memory;

int ckpt_prepare(job_config *job, const ckpt_data_identity *data, const ckpt_memory *memory, ckpt_start *out,
                 errbuf *err);
/* The job's model config.json (model.path's, or model.config with model.init random), as JSON
 * (for the manifest) and parsed. */
int ckpt_job_model_config(const job_config *job, json_t **obj, llama_config *cfg, errbuf *err);
int ckpt_adopt(job_config *job, int attempt, const char *resume_dir, const ckpt_memory *memory, ckpt_start *out,
               errbuf *err);

typedef struct ckpt_coord_hooks {
    void *arg;
    /* Sends a message to rank `rank` (global: on several nodes the leader's coordinator
     * serves every rank of the job); broadcast: to every rank. */
    void (*send)(void *arg, int rank, const msg *m);
    void (*broadcast)(void *arg, const msg *m);
    /* The job cannot go on (a sync save failed or missed its deadline). */
    void (*fatal)(void *arg, const char *reason);
    /* Optional: the same, for what no restart cures (checkpoint.max_failed_saves consecutive
     * failed saves); fatal when NULL. */
    void (*fatal_permanent)(void *arg, const char *reason);
    /* Optional: the commit of step's save is over, committed (1) or given up (0). */
    void (*settled)(void *arg, long long step, int committed);
} ckpt_coord_hooks;

typedef struct ckpt_coord_options {
    const job_config *job;  /* validated; outlives the coordinator */
    int world;              /* every rank of the job, on every node */
    int attempt;
    json_t *model_config;   /* borrowed */
    const char *base_fingerprint; /* adapter jobs: the frozen base's, for the manifests */
    const ckpt_identity *identity; /* the job's, for the manifests (NULL: none recorded) */
    struct event_base *base;
    ckpt_coord_hooks hooks;
} ckpt_coord_options;

typedef struct ckpt_coord ckpt_coord;

int ckpt_coord_new(ckpt_coord **out, const ckpt_coord_options *opt, errbuf *err);
void ckpt_coord_free(ckpt_coord *c);

/* Rank 0's METRICS message: its checkpoint note announces a save (or a skipped one);
 * total_steps goes into the manifests. */
void ckpt_coord_on_metrics(ckpt_coord *c, const msg_metrics *metrics);
/* A CKPT_DONE message from `rank`. */
void ckpt_coord_on_done(ckpt_coord *c, int rank, const msg_ckpt_done *done);
/* The consecutive failed saves and the last failure's reason (NULL: none yet), for status. */
void ckpt_coord_save_failures(const ckpt_coord *c, int *consecutive, const char **last_error);
/* Asks every worker for a checkpoint (stop: a synchronous one, then a stop); returns the
 * request's id. */
long long ckpt_coord_request(ckpt_coord *c, const char *why, int stop);
/* The job is over (every worker has exited): removes the partial directories of commits
 * still open or abandoned.  Returns how many were still open (not abandoned): a save every
 * rank finished training for but that never committed. */
int ckpt_coord_finish(ckpt_coord *c);

#endif
