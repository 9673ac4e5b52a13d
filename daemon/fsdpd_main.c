/* fsdpd: the node daemon.  Reads the job, joins the other nodes' daemons (daemon/cluster.h:
 * under SLURM, one fsdpd per node), spawns one fsdp-worker per GPU (or
 * runtime.workers_per_node on the CPU backend), supervises them to the end of the job and
 * exits 0 only when the job succeeded. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fault.h"
#include "base/fileio.h"
#include "base/path.h"
#include "daemon/cluster.h"
#include "daemon/consolidate.h"
#include "daemon/fabric.h"
#include "daemon/data_prepare.h"
#include "daemon/dir_lock.h"
#include "daemon/log.h"
#include "daemon/memory_ckpt.h"
#include "daemon/mlflow_log.h"
#include "daemon/model_card.h"
#include "daemon/replica.h"
#include "daemon/requeue.h"
#include "daemon/run_report.h"
#include "daemon/sample_prompts.h"
#include "daemon/slurm.h"
#include "daemon/supervisor.h"
#include "kernels/kernels.h"
#include "proto/job.h"
#include "proto/job_flags.h"

static int usage(void) {
    fprintf(stderr, "usage: fsdpd [--job JOB.json] [--defaults fsdpd|fsdp_qlora|trainer] [--section.key VALUE ...]\n"
                    "       [FLAG VALUE ...]  (fsdp_qlora's and the Trainer's flags: --lr, --batch_size,\n"
                    "       --per_device_train_batch_size, --dataset, ...: configs/jobs/README.md)\n");
    return 2;
}

/* fsdp-worker sits beside fsdpd unless FSDP_WORKER names another. */
static int find_worker(char *out, size_t n) {
    const char *env = getenv("FSDP_WORKER");
    if (env) return snprintf(out, n, "%s", env) < (int)n ? 0 : -1;
    char self[PATH_BYTES];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0) return -1;
    self[len] = '\0';
    return snprintf(out, n, "%s/fsdp-worker", dirname(self)) < (int)n ? 0 : -1;
}

/* output.consolidate: the last checkpoint (the final save is synchronous, so it is the end of
 * training) into output.dir as Hugging Face safetensors, with the source model's tokenizer;
 * an adapter job's as a PEFT adapter directory, and with output.merge the merged model in
 * output.dir/merged. */
static int consolidate_output(const job_config *job, errbuf *err) {
    consolidate_result r;
    consolidate_options o = {
        .ckpt = job->checkpoint.dir, .out = job->output.dir,
        .dtype = job->output.dtype == JOB_DTYPE_F32 ? ST_F32 : ST_BF16,
        /* auto: the adapter in F32, as PEFT saves it (its autocast_adapter_dtype keeps a bf16
         * model's adapters in fp32), the model and the merged model in BF16 */
        .adapter_dtype = job->output.dtype == JOB_DTYPE_BF16 ? ST_BF16 : ST_F32,
        .shard_bytes = (uint64_t)job->output.shard_size, .threads = 4,
        .tokenizer_from = job->model.init == JOB_INIT_PRETRAINED ? job->model.path : NULL,
        .merge = job->output.merge, .result = &r};
    if (consolidate(&o, err)) return -1;
    if (!r.adapter)
        log_event(-1, "consolidated step %lld into %s: %d tensors in %d files, %.3f GB %s, %.1f s",
                  (long long)r.step, job->output.dir, r.tensors, r.files, (double)r.bytes / 1e9,
                  st_dtype_name(o.dtype), r.seconds);
    else if (!job->output.merge)
        log_event(-1, "consolidated step %lld into %s: a PEFT adapter, %d tensors in 1 file, %.3f GB %s, %.1f s",
                  (long long)r.step, job->output.dir, r.tensors, (double)r.bytes / 1e9,
                  st_dtype_name(o.adapter_dtype), r.seconds);
    else
        log_event(-1, "consolidated step %lld into %s: a PEFT adapter, %d tensors in 1 file, %.3f GB %s; "
                      "the merged model in merged/, %d tensors in %d files, %.3f GB %s, %.1f s",
                  (long long)r.step, job->output.dir, r.tensors, (double)r.bytes / 1e9,
                  st_dtype_name(o.adapter_dtype), r.merged_tensors, r.merged_files,
                  (double)r.merged_bytes / 1e9, st_dtype_name(o.dtype), r.seconds);
    return 0;
}

/* What carries NCCL here (daemon/fabric.h), logged; on the CUDA backend the workers'
 * environment follows from it (NCCL's log in output.dir/nccl), and fabric.require may refuse. */
static int probe_fabric(const job_config *job, fabric_found *f, char *found, size_t n, errbuf *err) {
    if (fabric_probe(f, err)) return -1;
    fabric_describe(f, found, n);
    log_event(-1, "fabric: %s (%s)", fabric_kind(f), found);
    if (job->runtime.backend != JOB_BACKEND_CUDA) return 0;
    char dir[PATH_BYTES];
    if (path_join(dir, sizeof dir, job->output.dir, "nccl", err)) return -1;
    return fabric_setenv(f, job->fabric.require, dir, err);
}

/* checkpoint.dir's lock, held by the leader from before it writes there to its exit. */
static dir_lock ckpt_lock = {.fd = -1};
static void release_ckpt_lock(void) { dir_lock_release(&ckpt_lock); }

/* This node's in-memory checkpoint images (daemon/memory_ckpt.h), for the launch. */
static memory_images memory;

static int lock_checkpoint_dir(const job_config *job, const slurm_env *slurm, errbuf *err) {
    if (slurm->node_id != 0) return 0; /* the other nodes write only their own files */
    if (file_mkdir_p(job->checkpoint.dir, err) || dir_lock_acquire(&ckpt_lock, job->checkpoint.dir, slurm->job_id, err))
        return -1;
    atexit(release_ckpt_lock);
    return 0;
}

/* runtime.log_to mlflow's run, on the leader, marked with the launch's outcome at each exit
 * after training began. */
static mlflow_log *mlflow;
static int ended(int code, const char *status) {
    mlflow_log_finish(mlflow, status);
    mlflow = NULL;
    return code;
}

/* One run on the given nodes: joined, then the workers supervised to the end; *lost, the
 * nodes it lost (daemon/cluster.h: cluster_lost). */
static int run_once(supervisor_options *opt, const slurm_env *slurm, const msg_nodes *members, msg_nodes *spares,
                    int attempt, msg_nodes *lost, errbuf *err) {
    lost->n = 0;
    int node = 0;
    while (node < members->n && members->id[node] != slurm->node_id) node++;
    /* A launch's first run has no memory to resume (memory_ckpt_open removed the manifest). */
    int workers = opt->job->runtime.workers_per_node;
    int64_t held = attempt > 0 ? memory_ckpt_held(opt->job, opt->memory, node, workers * members->n) : -1;
    if (cluster_join(&opt->cluster, slurm, opt->job, members, spares, attempt, held, err))
        return SUPERVISOR_FAILED_PERMANENTLY;
    int rc = supervisor_run(opt, err);
    cluster_lost(opt->cluster, lost);
    if (slurm->node_id == 0) cluster_spares_alive(opt->cluster, spares); /* the spares that can still be used */
    cluster_free(opt->cluster);
    opt->cluster = NULL;
    return rc;
}

/* The lost nodes' places taken by spares (in their order, each at the lost one's index: the
 * same ranks); *lost keeps the ones no spare was left for. */
static void swap_in_spares(msg_nodes *members, msg_nodes *spares, msg_nodes *lost) {
    msg_nodes left = {0};
    for (int k = 0; k < lost->n; k++) {
        int i = 0;
        while (i < members->n && members->id[i] != lost->id[k]) i++;
        if (i == members->n || spares->n == 0) {
            left.id[left.n++] = lost->id[k];
            continue;
        }
        log_event(-1, "node %d gone: spare node %d takes its place (runtime.spare_nodes)", lost->id[k], spares->id[0]);
        members->id[i] = spares->id[0];
        memmove(spares->id, spares->id + 1, (size_t)(--spares->n) * sizeof spares->id[0]);
    }
    *lost = left;
}

/* The leader's next run after one that lost nodes: spares in their places, else without them
 * when runtime.allow_shrink lets it and the global batch still divides among the ranks left
 * (the accumulation grows), else no restart (a node whose daemon is gone cannot rejoin). */
static int replan(const job_config *job, msg_nodes *members, msg_nodes *spares, msg_nodes *lost, errbuf *err) {
    swap_in_spares(members, spares, lost);
    if (lost->n == 0) return 0;
    char gone[256];
    msg_nodes_list(lost, gone, sizeof gone);
    if (!job->runtime.allow_shrink)
        return errf(err, "node(s) %s gone, and runtime.allow_shrink is false (set it to true to go on without them)",
                    gone);
    msg_nodes left = {0};
    for (int i = 0; i < members->n; i++) {
        int dropped = 0;
        for (int k = 0; k < lost->n; k++) dropped |= members->id[i] == lost->id[k];
        if (!dropped) left.id[left.n++] = members->id[i];
    }
    static job_config smaller; /* large: off the stack */
    smaller = *job;
    int world = job->runtime.workers_per_node * left.n;
    if (job_resolve(&smaller, world, err))
        return errprefix(err, "node(s) %s gone; runtime.allow_shrink cannot go on with %d node(s)", gone, left.n);
    log_event(-1, "node(s) %s gone: going on with %d of %d nodes, %d ranks, accumulation %d (runtime.allow_shrink)",
              gone, left.n, members->n, world, smaller.train.grad_accum);
    *members = left;
    return 0;
}

/* The nodes of the next run after a failed one that may restart.  The leader keeps them, or
 * replaces or drops the lost (replan); a follower that lost the leader does not restart (only the leader
 * restarts a job across nodes; a relaunch resumes it), and takes the next run's nodes from the
 * leader's rendezvous file: a node it left out stops. */
static int next_members(const job_config *job, const slurm_env *slurm, int attempt, msg_nodes *lost,
                        msg_nodes *members, msg_nodes *spares, errbuf *err) {
    if (slurm->node_id == 0) return lost->n ? replan(job, members, spares, lost, err) : 0;
    if (lost->n) return errf(err, "this node lost the leader, which alone restarts a job across nodes");
    if (cluster_members(slurm, job, attempt, members, err)) return -1;
    for (int i = 0; i < members->n; i++)
        if (members->id[i] == slurm->node_id) return 0;
    char ids[256];
    msg_nodes_list(members, ids, sizeof ids);
    return errf(err, "the leader goes on without this node (SLURM node %d): its next run has nodes %s",
                slurm->node_id, ids);
}

/* A failed run not restarted: on several nodes with restarts on, the leader tells the
 * followers waiting for the next attempt (cluster_end_launch). */
static int give_up(const job_config *job, const slurm_env *slurm, int attempt, const char *why, const char *reason) {
    fprintf(stderr, "fsdpd: job failed%s: %s\n", why, reason);
    errbuf err;
    if (slurm->node_id == 0 && slurm->nnodes > 1 && (job->runtime.max_restarts > 0 || job->runtime.spare_nodes > 0) &&
        cluster_end_launch(slurm, job, attempt, reason, &err))
        fprintf(stderr, "fsdpd: cannot tell the other nodes: %s\n", err.msg);
    return ended(1, "FAILED");
}

/* A spare (runtime.spare_nodes) waits out the runs that do not need it: 1 once it is one of
 * an attempt's nodes (*attempt, *members), 2 when the job ended without it, -1 (err). */
static int stand_by(const job_config *job, const slurm_env *slurm, int *attempt, msg_nodes *members, replica_sink *sink,
                    errbuf *err) {
    log_event(-1, "a spare node (runtime.spare_nodes = %d): joined, no ranks, until a node is gone",
              job->runtime.spare_nodes);
    /* It follows the leader: a preemption's SIGTERM (or SIGINT) stops the job there, whose
     * end reaches this node as STOP; dying of the signal would make srun end the others. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    int rc;
    while ((rc = cluster_stand_by(slurm, job, *attempt, sink, members, err)) == 0) ++*attempt;
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    return rc;
}

/* A spare node's life: standing by (with in-memory checkpoints, taking the active nodes'
 * copies: daemon/replica.h) until a run needs it, as stand_by says; once one does, the copy of
 * the node whose place it takes becomes its own images. */
static int spare(const job_config *job, const slurm_env *slurm, int *attempt, msg_nodes *members, errbuf *err) {
    replica_sink *sink = NULL;
    errbuf why;
    if (memory.fd && replica_sink_open(&sink, job->runtime.workers_per_node, &why))
        log_event(-1, "this spare takes no copies of the in-memory checkpoints: %s", why.msg);
    int rc = stand_by(job, slurm, attempt, members, sink, err);
    int node = 0;
    while (node < members->n && members->id[node] != slurm->node_id) node++;
    if (rc == 1 && sink && replica_sink_adopt(sink, node, &memory, &why))
        log_event(-1, "%s: a restart resumes from disk", why.msg);
    replica_sink_close(sink);
    return rc;
}

/* runtime.spare_nodes: the allocation's last nodes; at least one node trains. */
static int check_spares(const job_config *job, const slurm_env *slurm, errbuf *err) {
    int k = job->runtime.spare_nodes;
    if (k > 0 && k >= slurm->nnodes)
        return errf(err, "runtime.spare_nodes: %d spare(s) of %d node(s) leave none to train", k, slurm->nnodes);
    return 0;
}

int main(int argc, char **argv) {
    requeue_catch_early_usr1(); /* SLURM's time-limit warning must never kill fsdpd */
    static job_args args;
    static job_config job;
    static job_notes notes;
    errbuf err;
    if (job_args_parse(argc, argv, &args, &err)) {
        fprintf(stderr, "fsdpd: %s\n", err.msg);
        return usage();
    }
    if (args.help) {
        usage();
        return 0;
    }
    if (argc == 1) return usage(); /* nothing asked: say how to ask */
    static slurm_env slurm;
    if (fault_init(&err) || slurm_env_read(&slurm, &err)) goto bad_job;
    if (slurm.nnodes > MSG_NODES_MAX) {
        errf(&err, "SLURM_NNODES %d: fsdpd runs on at most %d nodes", slurm.nnodes, MSG_NODES_MAX);
        goto bad_job;
    }
    log_set_node(slurm.node_id);
    if (job_args_load(&job, &args, &notes, &err)) goto bad_job;
    for (int i = 0; i < notes.n; i++) log_event(-1, "note: %s", notes.line[i]);
    if (slurm.nnodes > 1 && slurm.job_id[0] && (job.runtime.allow_shrink || job.runtime.spare_nodes > 0))
        log_event(-1, "note: runtime.%s: srun must let the other nodes run on when one node's fsdpd exits "
                      "(srun --kill-on-bad-exit=0; slurm/launch.slurm: FSDP_SRUN_KILL_ON_BAD_EXIT=0)",
                  job.runtime.spare_nodes > 0 ? "spare_nodes" : "allow_shrink");
    if (job_resolve_runtime(&job, k_cuda_available(), &err)) goto bad_job;
    int workers = job.runtime.workers_per_node;
    if (check_spares(&job, &slurm, &err)) goto bad_job;
    int active = slurm.nnodes - job.runtime.spare_nodes; /* the nodes that train */
    if (job_resolve(&job, workers * active, &err) || job_validate(&job, workers * active, &err)) goto bad_job;
    if (lock_checkpoint_dir(&job, &slurm, &err) || file_mkdir_p(job.output.dir, &err)) goto bad_job;
    if (memory_ckpt_open(&job, slurm.node_id, job.runtime.workers_per_node, &memory, &err)) goto bad_job;
    static ckpt_data_identity data_identity;
    static char data_file[JOB_PATH_MAX]; /* data.path as given: data_prepare names the cache there */
    snprintf(data_file, sizeof data_file, "%s", job.data.path);
    if (data_prepare(&job, &data_identity, &err)) goto bad_job;
    static sample_prompts samples; /* the workers' CONFIG carries them, every run */
    if (sample_prompts_load(&samples, &job, &err)) goto bad_job;

    /* A worker that dies leaves a closed socket behind: writing to it must be an error the
     * loop handles, not a SIGPIPE that kills the daemon. */
    signal(SIGPIPE, SIG_IGN);
    char worker_path[PATH_BYTES];
    if (find_worker(worker_path, sizeof worker_path) || access(worker_path, X_OK) != 0) {
        fprintf(stderr, "fsdpd: cannot find the fsdp-worker executable (%s)\n", worker_path);
        return 1;
    }
    /* Workers compute with one BLAS thread each (reproducible, and no oversubscription);
     * OpenBLAS reads this when it loads, so it must be in the environment they inherit. */
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);

    log_event(-1, "job %s: %d workers, backend %s; checkpoints in %s, output in %s, metrics %s",
              args.job_path ? args.job_path : "(from the command line)", workers, job.runtime.backend == JOB_BACKEND_CUDA ? "cuda" : "cpu", job.checkpoint.dir,
              job.output.dir, job.runtime.metrics);
    static fabric_found fabric;
    static char found[4 * PATH_BYTES];
    if (probe_fabric(&job, &fabric, found, sizeof found, &err)) goto bad_job;
    if (slurm.node_id == 0 && mlflow_log_start(&mlflow, &job, &err)) {
        fprintf(stderr, "fsdpd: %s\n", err.msg);
        return 1;
    }
    static run_record record;
    static run_progress progress;
    progress.started = clock_now_s();
    supervisor_options opt = {.job = &job, .workers = workers, .worker_path = worker_path,
                              .fabric_kind = fabric_kind(&fabric), .fabric_found = found,
                              .data_identity = &data_identity, .record = &record, .progress = &progress,
                              .mlflow = mlflow, .samples = samples.p.n ? &samples : NULL,
                              .memory = &memory};
    /* A failed run starts again from the newest committed checkpoint, up to max_restarts
     * times; a run stopped on request (a signal, `fsdpctl stop`) does not, nor one whose
     * error no restart can cure (a corrupt checkpoint, a missing file).  On several nodes every
     * node takes the same decision: the leader tells the others whether the failure is one a
     * restart cures, and re-plans the nodes (next_members). */
    int64_t start_step = requeue_start_step(&job); /* a requeue needs a checkpoint past it */
    static msg_nodes members, lost, spares;
    for (int i = 0; i < slurm.nnodes; i++) {
        msg_nodes *to = i < active ? &members : &spares;
        to->id[to->n++] = i;
    }
    int rc, restarts = 0;
    if (slurm.node_id >= active && (rc = spare(&job, &slurm, &restarts, &members, &err)) != 1) {
        if (rc < 0) fprintf(stderr, "fsdpd: %s\n", err.msg);
        else log_event(-1, "the job ended without needing this spare node");
        return rc < 0 ? 1 : 0;
    }
    if (restarts > 0) job.checkpoint.resume = JOB_RESUME_AUTO; /* a spare taking a place: as every restart */
    for (; opt.restart = restarts, (rc = run_once(&opt, &slurm, &members, &spares, restarts, &lost, &err)) < 0;
         restarts++) {
        errbuf next;
        if (rc == SUPERVISOR_FAILED_PERMANENTLY && restarts < job.runtime.max_restarts)
            return give_up(&job, &slurm, restarts + 1, " (not restarted: a restart cannot cure this)", err.msg);
        if (restarts >= job.runtime.max_restarts)
            return give_up(&job, &slurm, restarts + 1, restarts ? " after its restarts" : "", err.msg);
        if (next_members(&job, &slurm, restarts + 1, &lost, &members, &spares, &next)) {
            char why[sizeof next.msg + 32];
            snprintf(why, sizeof why, " (not restarted: %s)", next.msg);
            return give_up(&job, &slurm, restarts + 1, why, err.msg);
        }
        log_event(-1, "restart %d of %d after: %s", restarts + 1, job.runtime.max_restarts, err.msg);
        job.checkpoint.resume = JOB_RESUME_AUTO;
    }
    if (rc == SUPERVISOR_PREEMPTED) return ended(requeue_after_stop(&job, &slurm, start_step, err.msg), "KILLED");
    if (rc > 0) {
        fprintf(stderr, "fsdpd: %s\n", err.msg);
        return ended(1, "KILLED");
    }
    log_event(-1, "job finished");
    /* The checkpoint is one, in the shared directory: the leader consolidates it. */
    if (job.output.consolidate && slurm.node_id == 0 && consolidate_output(&job, &err)) {
        fprintf(stderr, "fsdpd: consolidation failed: %s\n", err.msg);
        return ended(1, "FAILED");
    }
    /* The summary, in the log and run.json (the leader's: the one that wrote run.json). */
    if (slurm.node_id == 0 && run_report_finish(&record, opt.job, &progress, &err)) {
        fprintf(stderr, "fsdpd: the run's summary: %s\n", err.msg);
        return ended(1, "FAILED");
    }
    /* The output ready to use: template, stops, tokenizer, loss curve, model card. */
    if (job.output.consolidate && slurm.node_id == 0) {
        if (model_card_write(&job, data_file, &record, &err)) {
            fprintf(stderr, "fsdpd: %s\n", err.msg);
            return ended(1, "FAILED");
        }
        log_event(-1, "%s: %s with its model card", job.output.dir, MODEL_CARD_NAME);
    }
    return ended(0, "FINISHED");

bad_job:
    fprintf(stderr, "fsdpd: %s\n", err.msg);
    return 2;
}
