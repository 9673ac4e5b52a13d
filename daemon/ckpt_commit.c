/* ckpt_commit: the checkpoint coordinator.  See ckpt_commit.h. */
#include "base/path.h"
#include "daemon/ckpt_commit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/bytes.h"
#include "base/fileio.h"
#include "base/sha256.h"
#include "daemon/log.h"
#include "daemon/memory_ckpt.h"
#include "proto/ckpt.h"
#include "proto/model_config.h"

#define CONFIG_MAX (1u << 20)

/* ---- before the workers start ---- */

int ckpt_job_model_config(const job_config *job, json_t **obj, llama_config *cfg, errbuf *err) {
    const char *src = job->model.init == JOB_INIT_RANDOM ? job->model.config : job->model.path;
    char path[PATH_BYTES];
    struct stat st;
    int is_dir = stat(src, &st) == 0 && S_ISDIR(st.st_mode);
    if (snprintf(path, sizeof path, is_dir ? "%s/config.json" : "%s", src) >= (int)sizeof path)
        return errf(err, "%s: path too long", src);
    char *text;
    size_t len;
    if (file_read_all(path, CONFIG_MAX, &text, &len, err)) return -1;
    int rc = llama_config_parse(cfg, text, len, path, err);
    if (rc == 0) rc = llama_config_check_seq_len(cfg, "data.seq_len", job->data.seq_len, path, err);
    json_error_t je;
    *obj = rc == 0 ? json_loadb(text, len, 0, &je) : NULL;
    free(text);
    if (rc == 0 && !*obj) rc = errf(err, "%s: %s", path, je.text);
    return rc;
}

/* Removes the partial directories earlier runs left; *attempt is one above theirs. */
static int clear_partials(const char *dir, int *attempt, errbuf *err) {
    *attempt = 1;
    DIR *d = opendir(dir);
    if (!d) return errf(err, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        int64_t step;
        int a;
        char path[PATH_BYTES];
        if (!ckpt_parse_partial_name(e->d_name, &step, &a)) continue;
        if (a >= *attempt) *attempt = a < INT_MAX - 1 ? a + 1 : a;
        rc = path_join(path, sizeof path, dir, e->d_name, err);
        if (rc == 0) {
            log_event(-1, "removing %s, left by an earlier run", path);
            rc = file_remove_tree(path, err);
        }
    }
    closedir(d);
    return rc;
}

/* The job's model: the fingerprint of model.path's weights (an adapter job's frozen base),
 * which its checkpoints record and its resume checks; for a random init the SHA-256 of its
 * config and seed, which determine it. */
static int model_fingerprint(const job_config *job, const json_t *config, char out[ST_FINGERPRINT_HEX],
                             errbuf *err) {
    out[0] = '\0';
    if (job->model.init == JOB_INIT_RANDOM) {
        char *text = json_dumps(config, JSON_SORT_KEYS | JSON_COMPACT), seed[32];
        if (!text) return errf(err, "out of memory");
        unsigned char digest[SHA256_BYTES];
        sha256_ctx h;
        snprintf(seed, sizeof seed, "random init, seed %lld", (long long)job->train.seed);
        sha256_init(&h);
        sha256_update(&h, text, strlen(text));
        sha256_update(&h, seed, strlen(seed));
        sha256_final(&h, digest);
        free(text);
        hex_encode(digest, SHA256_BYTES, out);
        return 0;
    }
    st_model st;
    if (st_model_open(&st, job->model.path, err))
        return errprefix(err, job->train.type == JOB_TRAIN_FULL ? "the model" : "the adapters' base");
    st_model_fingerprint(&st, out);
    st_model_close(&st);
    return 0;
}

static void job_train_settings(const job_config *j, ckpt_train_settings *t) {
    *t = (ckpt_train_settings){.lr = j->train.lr, .min_lr = j->train.min_lr,
                               .weight_decay = j->train.weight_decay,
                               .betas = {j->train.betas[0], j->train.betas[1]},
                               .eps = j->train.eps, .clip_norm = j->train.clip_norm,
                               .warmup_steps = j->train.warmup_steps,
                               .warmup_ratio = j->train.warmup_ratio};
    snprintf(t->schedule, sizeof t->schedule, "%s", job_schedule_name(j->train.schedule));
    snprintf(t->warmup_round, sizeof t->warmup_round, "%s", j->train.warmup_round == JOB_ROUND_DOWN ? "down" : "up");
    snprintf(t->objective, sizeof t->objective, "%s", job_objective_name(j->train.objective));
    snprintf(t->dpo_loss, sizeof t->dpo_loss, "%s", job_dpo_loss_name(j->train.dpo_loss));
    t->dpo_beta = j->train.dpo_beta;
    t->dpo_label_smoothing = j->train.dpo_label_smoothing;
    t->orpo_lambda = j->train.orpo_lambda;
}

static void job_adapter(const job_config *j, const char *fingerprint, ckpt_adapter *a) {
    memset(a, 0, sizeof *a);
    snprintf(a->type, sizeof a->type, "%s", job_train_type_name(j->train.type));
    a->lora = j->lora.config;
    snprintf(a->base_fingerprint, sizeof a->base_fingerprint, "%s", fingerprint);
}

/* The job's identity for its manifests and for the comparison with a checkpoint's. */
static void job_identity(const job_config *j, const ckpt_data_identity *data, const char *fingerprint,
                         ckpt_identity *id) {
    memset(id, 0, sizeof *id);
    snprintf(id->train_type, sizeof id->train_type, "%s", job_train_type_name(j->train.type));
    snprintf(id->model_fingerprint, sizeof id->model_fingerprint, "%s", fingerprint);
    snprintf(id->optimizer, sizeof id->optimizer, "adamw");
    if (data) id->data = *data;
    snprintf(id->data_format, sizeof id->data_format, "%s", job_data_format_name(j->data.format));
    snprintf(id->data_template, sizeof id->data_template, "%s", j->data.template_name);
    id->seq_len = j->data.seq_len;
    id->packing = j->data.packing;
    id->shuffle = j->data.shuffle;
    id->eval_fraction = j->data.eval_fraction;
    id->max_steps = j->train.max_steps;
    id->epochs = j->train.epochs;
}

/* The checkpoint's kind is the job's: adapters of the same shapes (rank, targets) over the same
 * base's shapes, or a whole model.  What else differs is the identity's (check_identity). */
static int check_adapter(const job_config *job, const ckpt_manifest *m, const char *name, errbuf *err) {
    int adapters = job->train.type != JOB_TRAIN_FULL;
    if (m->has_adapter != adapters)
        return errf(err, "%s: %s, but the job is %s", name,
                    m->has_adapter ? "an adapter checkpoint" : "a full model's checkpoint",
                    adapters ? "an adapter job (train.type lora)" : "a full fine-tune");
    if (!adapters) return 0;
    lora_config want = job->lora.config;
    const lora_config *got = &m->adapter.lora;
    if (got->rank != want.rank || got->targets != want.targets)
        return errf(err, "%s: adapters of rank %d on other targets or of another rank than the job's "
                         "lora settings (rank %d): their shapes differ, no resume can read them; start "
                         "afresh in another checkpoint.dir", name, got->rank, want.rank);
    return 0;
}

/* The checkpoint must be this job's (the same identity, train and adapter settings): each
 * difference is logged with both values; any that the documented rule does not allow refuses
 * the resume, unless checkpoint.resume is force. */
static int check_identity(const job_config *job, const ckpt_manifest *m, const ckpt_start *start,
                          const char *name, errbuf *err) {
    ckpt_train_settings train;
    ckpt_adapter adapter;
    static ckpt_difference d[CKPT_MAX_DIFFERENCES]; /* fsdpd prepares from its main thread only */
    job_train_settings(job, &train);
    job_adapter(job, start->base_fingerprint, &adapter);
    int n = ckpt_identity_compare(m, &start->identity, &train, job->train.type != JOB_TRAIN_FULL ? &adapter : NULL, d);
    int force = job->checkpoint.resume == JOB_RESUME_FORCE, refused = 0;
    char fields[512] = "";
    for (int i = 0; i < n && i < CKPT_MAX_DIFFERENCES; i++) {
        log_event(-1, "%s: %s is %s in the checkpoint, %s in this job%s", name, d[i].field, d[i].checkpoint,
                  d[i].job, d[i].allowed ? " (allowed: the job's is used)" : force ? " (checkpoint.resume force: resumed anyway)" : "");
        if (d[i].allowed) continue;
        size_t at = strlen(fields);
        if (at + sizeof d[i].field + 2 < sizeof fields)
            snprintf(fields + at, sizeof fields - at, "%s%.39s", refused ? ", " : "", d[i].field);
        refused++;
    }
    if (!refused || force) return 0;
    return errf(err, "%s: a checkpoint of another job (%s differ%s; each is logged with both values): "
                     "start afresh in a new checkpoint.dir, or resume it anyway with checkpoint.resume=force",
                name, fields, refused == 1 ? "s" : "");
}

/* Every strategy's checkpoint is read the same way (re-sliced from its n_files shards), by
 * any strategy: the name is only recorded. */
static int known_sharding(const char *name) {
    for (int s = JOB_SHARD_FULL; s <= JOB_SHARD_HYBRID; s++)
        if (!strcmp(name, job_sharding_name((job_sharding)s))) return 1;
    return 0;
}

/* train.global_batch and train.seed are the checkpoint's for the job's life: a job's own other
 * values are said, one line each. */
static void take_fixed(job_config *job, const ckpt_manifest *m, const char *name) {
    if (m->global_batch != job->train.global_batch)
        log_event(-1, "train.global_batch is %d, from the checkpoint %s (the job says %d; "
                  "a checkpoint fixes it for the job's life)", m->global_batch, name,
                  job->train.global_batch);
    if (m->seed != job->train.seed)
        log_event(-1, "train.seed is %lld, from the checkpoint %s (the job says %lld; "
                  "a checkpoint fixes it for the job's life)", (long long)m->seed, name,
                  (long long)job->train.seed);
    job->train.global_batch = m->global_batch;
    job->train.seed = m->seed;
}

/* The model's fingerprint (after the checkpoint's seed: a random init depends on it) and the
 * job's identity. */
static int identify(const job_config *job, const ckpt_data_identity *data, ckpt_start *out, errbuf *err) {
    if (model_fingerprint(job, out->model_config, out->base_fingerprint, err)) return -1;
    job_identity(job, data, out->base_fingerprint, &out->identity);
    return 0;
}

/* Checks the checkpoint at out->resume_dir fits the job and is its own (data NULL: a
 * follower, the leader compared the identities), and takes its global_batch and seed. */
static int check_resume(job_config *job, const ckpt_data_identity *data, ckpt_start *out, errbuf *err) {
    ckpt_manifest m;
    char name[PATH_BYTES];
    const char *path = out->resume_dir;
    /* From memory: the memory manifest in checkpoint.dir (resume_dir), its files in the nodes'
     * images, which each node checked (memory_ckpt_check). */
    if (path_join(name, sizeof name, path, out->from_memory ? CKPT_MEMORY_MANIFEST : CKPT_MANIFEST, err) ||
        ckpt_manifest_load_file(&m, name, err))
        return -1;
    take_fixed(job, &m, name);
    int rc = identify(job, data, out, err);
    if (rc == 0) rc = ckpt_manifest_check_model(&m, &out->model, name, err);
    if (rc == 0) rc = check_adapter(job, &m, name, err);
    if (rc == 0 && data) rc = check_identity(job, &m, out, name, err);
    if (rc == 0 && !out->from_memory) rc = ckpt_verify(path, &m, 0, err);
    if (rc == 0 && !known_sharding(m.sharding))
        rc = errf(err, "%s: sharding '%s' cannot be read", name, m.sharding);
    if (rc == 0) {
        out->resume_step = m.step;
        log_event(-1, "resuming from %s: step %lld, %lld samples, written by %d ranks (%s)", out->from_memory ? name : path,
                  (long long)m.step, (long long)m.global_sample, m.world_size, m.sharding);
    }
    ckpt_manifest_free(&m);
    return rc;
}

/* No silent loss: the committed steps after the one the job starts from (0: a fresh start)
 * would be overwritten by this run's saves; they move to superseded/step-N, which `keep`
 * never prunes (one moved there before under that name gets a .K suffix). */
static int supersede_later(const char *dir, long long from, errbuf *err) {
    int64_t *steps;
    int n, rc = 0;
    char sup[PATH_BYTES];
    if (ckpt_list(dir, &steps, &n, err) || path_join(sup, sizeof sup, dir, CKPT_SUPERSEDED, err)) return -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        char name[64], src[PATH_BYTES], dst[PATH_BYTES + 16];
        if (steps[i] <= from) continue;
        rc = file_mkdir_p(sup, err);
        if (rc == 0) rc = ckpt_step_name(name, sizeof name, steps[i]) ? errf(err, "bad step") : 0;
        if (rc == 0) rc = path_join(src, sizeof src, dir, name, err);
        for (int k = 0; rc == 0; k++) {
            struct stat st;
            snprintf(dst, sizeof dst, k ? "%s/%s.%d" : "%s/%s", sup, name, k);
            if (lstat(dst, &st) != 0) break;
        }
        if (rc == 0 && rename(src, dst) != 0)
            rc = errf(err, "rename %s -> %s: %s", src, dst, strerror(errno));
        if (rc == 0)
            log_event(-1, "moved %s to %s: this run starts from step %lld and would replace it (it is kept; "
                          "remove it by hand)", src, dst, from);
    }
    free(steps);
    if (rc == 0 && n) rc = file_fsync_dir(dir, 1, err);
    return rc;
}

/* Resumes from the in-memory checkpoint instead of out->resume_dir (found: 1 when that is
 * set) when every node holds one at least as new: 1 when it does, 0 when not, -1 (err). */
static int take_memory(const job_config *job, const ckpt_memory *memory, int found, ckpt_start *out, errbuf *err) {
    int64_t disk = -1;
    const char *slash = strrchr(out->resume_dir, '/');
    if (!memory || memory->step < 0 || job->checkpoint.resume != JOB_RESUME_AUTO) return 0;
    if (found == 1 && !ckpt_parse_step_name(slash ? slash + 1 : out->resume_dir, &disk)) return 0;
    if (memory->step < disk) return 0;
    if (memory_ckpt_check(job, memory->images, memory->node, memory->world, memory->step, err)) return -1;
    snprintf(out->resume_dir, sizeof out->resume_dir, "%s", job->checkpoint.dir);
    out->from_memory = 1;
    char was[64] = "none";
    if (disk >= 0) snprintf(was, sizeof was, "step %lld", (long long)disk);
    log_event(-1, "resuming from the in-memory checkpoint of step %lld, which every node holds (latest on disk: %s)",
              (long long)memory->step, was);
    return 1;
}

int ckpt_prepare(job_config *job, const ckpt_data_identity *data, const ckpt_memory *memory, ckpt_start *out,
                 errbuf *err) {
    memset(out, 0, sizeof *out);
    const char *dir = job->checkpoint.dir;
    if (ckpt_job_model_config(job, &out->model_config, &out->model, err)) return -1;
    int rc = file_mkdir_p(dir, err);
    if (rc == 0) rc = clear_partials(dir, &out->attempt, err);
    int found = rc == 0 ? ckpt_resolve(dir, job->checkpoint.resume, job->checkpoint.resume_step,
                                       out->resume_dir, sizeof out->resume_dir, err)
                        : -1;
    int memory_found = found >= 0 ? take_memory(job, memory, found, out, err) : 0;
    if (memory_found) found = memory_found; /* 1: from memory; -1: its check failed */
    if (found < 0) rc = -1;
    if (found == 0) out->resume_dir[0] = '\0';
    if (found == 0) rc = identify(job, data, out, err);
    if (found == 1) rc = check_resume(job, data, out, err);
    if (rc == 0) rc = supersede_later(dir, found == 1 ? out->resume_step : 0, err);
    if (rc) {
        json_decref(out->model_config);
        out->model_config = NULL;
    }
    return rc;
}

/* The leader's plan may only name a committed step of this job's own checkpoint.dir: a
 * directory step-N right inside it (symbolic links resolved, so none leads out), with its
 * manifest.  Anything else is not this job's checkpoint, whoever sent it. */
static int check_leaders_resume(const job_config *job, const char *resume_dir, errbuf *err) {
    char dir[PATH_MAX], real[PATH_MAX], parent[PATH_MAX];
    int64_t step;
    if (!realpath(job->checkpoint.dir, dir)) return errf(err, "%s: %s", job->checkpoint.dir, strerror(errno));
    if (!realpath(resume_dir, real))
        return errf(err, "the leader's plan resumes from %s: %s", resume_dir, strerror(errno));
    snprintf(parent, sizeof parent, "%s", real);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = '\0';
    char manifest[PATH_MAX + 32];
    snprintf(manifest, sizeof manifest, "%s/%s", real, CKPT_MANIFEST);
    struct stat st;
    if (!slash || strcmp(parent, dir) != 0 || !ckpt_parse_step_name(slash + 1, &step) ||
        stat(manifest, &st) != 0 || !S_ISREG(st.st_mode))
        return errf(err, "the leader's plan resumes from %s (%s), which is not a committed step-N of this job's "
                    "checkpoint.dir %s: refused", resume_dir, real, dir);
    return 0;
}

int ckpt_adopt(job_config *job, int attempt, const char *resume_dir, const ckpt_memory *memory, ckpt_start *out,
               errbuf *err) {
    memset(out, 0, sizeof *out);
    out->attempt = attempt;
    if (memory->step >= 0) { /* the leader's plan: every node's memory, this one's own */
        if (memory_ckpt_check(job, memory->images, memory->node, memory->world, memory->step, err))
            return errprefix(err, "the leader's plan resumes from memory");
        resume_dir = job->checkpoint.dir;
        out->from_memory = 1;
    }
    if (snprintf(out->resume_dir, sizeof out->resume_dir, "%s", resume_dir) >= (int)sizeof out->resume_dir)
        return errf(err, "the leader's checkpoint path is too long");
    if (resume_dir[0] && !out->from_memory && check_leaders_resume(job, resume_dir, err)) return -1;
    if (ckpt_job_model_config(job, &out->model_config, &out->model, err)) return -1;
    /* No data identity: the leader compared the checkpoint's identity with the job's. */
    if (resume_dir[0] ? check_resume(job, NULL, out, err) : identify(job, NULL, out, err)) {
        json_decref(out->model_config);
        out->model_config = NULL;
        return -1;
    }
    return 0;
}

/* ---- commits ---- */

typedef struct rank_report {
    int reported, ok;
    char file[CKPT_NAME_MAX];
    uint64_t bytes;
    uint32_t header_crc;
    double stage_s, write_s;
} rank_report;

typedef struct commit {
    struct commit *next; /* the next newer one */
    ckpt_coord *coord;
    long long step;
    int attempt, sync;
    int armed;           /* its deadline runs */
    int abandoned;
    int stuck;           /* abandoned, and its writers did not stop within timeout_s of the abort */
    char partial[PATH_BYTES];
    double started;
    struct event *deadline;
    int n_reported;
    rank_report *ranks; /* [n_files] */
    json_t *units;      /* rank 0's layout */
    long long optimizer_step, tokens_seen;
} commit;

struct ckpt_coord {
    ckpt_coord_options opt;
    const job_config *job;
    int n_files;
    commit *commits;         /* oldest first */
    commit *memory;          /* the newest in-memory save being reported (no deadline, no
                              * directory: the images are in the nodes' memory) */
    long long memory_step;   /* the memory manifest's step, -1 for none yet */
    long long memory_saves;  /* in-memory saves kept since the last line about them */
    double memory_logged;    /* when that line was */
    long long requests;      /* request ids handed out */
    long long latest_step;   /* what `latest` points to, -1 for nothing yet */
    long long total_steps;   /* of the training run, from rank 0's METRICS */
    int failed_saves;        /* consecutive failed saves (a failure and its retry count once) */
    int retry_pending;       /* a save failed: the next one to settle is its retry */
    char last_error[768];    /* the last failed save's reason ("" for none) */
};

int ckpt_coord_new(ckpt_coord **out, const ckpt_coord_options *opt, errbuf *err) {
    ckpt_coord *c = calloc(1, sizeof *c);
    if (!c) return errf(err, "out of memory");
    c->opt = *opt;
    c->job = opt->job;
    c->n_files = ckpt_n_files(opt->job, opt->world);
    c->latest_step = -1;
    c->memory_step = -1;
    *out = c;
    return 0;
}

static void free_commit(commit *m) {
    ckpt_coord *c = m->coord;
    for (commit **p = &c->commits; *p; p = &(*p)->next)
        if (*p == m) {
            *p = m->next;
            break;
        }
    if (m->deadline) event_free(m->deadline);
    json_decref(m->units);
    free(m->ranks);
    free(m);
}

void ckpt_coord_free(ckpt_coord *c) {
    if (!c) return;
    while (c->commits) free_commit(c->commits);
    if (c->memory) free_commit(c->memory);
    free(c);
}

static void remove_partial(commit *m) {
    errbuf err;
    if (file_remove_tree(m->partial, &err)) log_event(-1, "%s", err.msg);
}

/* "rank 1", "ranks 1, 3": the writers that have not reported. */
static void late_ranks(const commit *m, char *out, size_t n) {
    int count = 0;
    size_t at = 0;
    out[0] = '\0';
    for (int r = 0; r < m->coord->n_files; r++)
        if (!m->ranks[r].reported) count++;
    at += (size_t)snprintf(out, n, count == 1 ? "rank" : "ranks");
    for (int r = 0, i = 0; r < m->coord->n_files && at < n; r++)
        if (!m->ranks[r].reported) at += (size_t)snprintf(out + at, n - at, "%s %d", i++ ? "," : "", r);
}

/* Whether the saves after m wait for it before their deadlines start: a rank writes one save
 * at a time, so a later save cannot begin on a rank still writing m. */
static int holds_writers(const commit *m) {
    return !m->abandoned || (m->n_reported < m->coord->n_files && !m->stuck);
}

static void start_timer(commit *m) {
    struct timeval limit = {m->coord->job->checkpoint.timeout_s, 0};
    evtimer_del(m->deadline);
    evtimer_add(m->deadline, &limit);
}

/* Starts the deadline of every save that no earlier save holds up. */
static void arm_ready(ckpt_coord *c) {
    for (commit *m = c->commits; m; m = m->next) {
        if (!m->armed) {
            m->armed = 1;
            start_timer(m);
        }
        if (holds_writers(m)) return;
    }
}

/* An async save failed.  The first failure asks for a save at once (its retry: a request
 * for a synchronous save, which the ranks serve at the next step), and does not count; a failed
 * retry counts one, and checkpoint.max_failed_saves consecutive ones stop the job (no
 * restart or requeue can cure a full or read-only file system): training on with no
 * checkpoint would lose everything at the final save.  `latest` stays as it was. */
static long long request_save(ckpt_coord *c, const char *why, int stop, int sync);

static void count_failure(ckpt_coord *c, long long step, const char *why) {
    snprintf(c->last_error, sizeof c->last_error, "checkpoint of step %lld: %s", step, why);
    if (!c->retry_pending) {
        c->retry_pending = 1;
        log_event(-1, "checkpoint of step %lld failed; retrying it synchronously at the next step before it counts",
                  step);
        request_save(c, "retrying a failed save", 0, 1);
        return;
    }
    c->retry_pending = 0;
    int max = c->job->checkpoint.max_failed_saves;
    c->failed_saves++;
    log_event(-1, "%d consecutive failed checkpoint save%s (checkpoint.max_failed_saves = %d); the last: %s",
              c->failed_saves, c->failed_saves == 1 ? "" : "s", max, c->last_error);
    if (c->failed_saves < max) return;
    char reason[1024];
    snprintf(reason, sizeof reason, "%d consecutive checkpoint saves failed (checkpoint.max_failed_saves); "
             "the last: %.700s; stopping the job (latest is unchanged)", c->failed_saves, c->last_error);
    if (c->opt.hooks.fatal_permanent) c->opt.hooks.fatal_permanent(c->opt.hooks.arg, reason);
    else c->opt.hooks.fatal(c->opt.hooks.arg, reason);
}

void ckpt_coord_save_failures(const ckpt_coord *c, int *consecutive, const char **last_error) {
    *consecutive = c->failed_saves;
    *last_error = c->last_error[0] ? c->last_error : NULL;
}

/* The commit cannot finish: an async save is abandoned (its writers are told to stop, the
 * directory goes once they have), a sync one stops the job, except a sync save while a failed
 * save's retry is pending (that retry; never the final save, whose failure must fail the job)
 * that failed without being stuck (no rank still writing: the next collective cannot stall),
 * which counts as a failed save.  The writers get timeout_s to honour the abort
 * before later saves stop waiting for them. */
static void give_up(commit *m, const char *why, int stuck) {
    ckpt_coord *c = m->coord;
    char reason[1024];
    int counted = !m->sync || (c->retry_pending && !stuck && m->step < c->total_steps);
    if (!counted) {
        snprintf(reason, sizeof reason, "checkpoint of step %lld (sync): %s; stopping the job", m->step, why);
        c->opt.hooks.fatal(c->opt.hooks.arg, reason); /* which logs it */
    } else {
        log_event(-1, "checkpoint of step %lld abandoned: %s; training goes on", m->step, why);
    }
    m->abandoned = 1;
    m->armed = 1;
    start_timer(m);
    for (int r = 0; r < c->n_files; r++) {
        msg abort = {.type = MSG_CKPT_ABORT, .u.ckpt_abort = {.step = m->step, .attempt = m->attempt, .rank = r}};
        if (!m->ranks[r].reported) c->opt.hooks.send(c->opt.hooks.arg, r, &abort);
    }
    long long step = m->step;
    if (m->n_reported == c->n_files) {
        remove_partial(m);
        free_commit(m);
    }
    arm_ready(c);
    if (counted) count_failure(c, step, why);
    if (c->opt.hooks.settled) c->opt.hooks.settled(c->opt.hooks.arg, step, 0);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    commit *m = arg;
    char late[256], why[512];
    late_ranks(m, late, sizeof late);
    if (m->abandoned) {
        log_event(-1, "checkpoint of step %lld: %s still writing %d s after it was abandoned; later "
                         "saves no longer wait for it", m->step, late, m->coord->job->checkpoint.timeout_s);
        m->stuck = 1;
        arm_ready(m->coord);
        return;
    }
    snprintf(why, sizeof why, "%s did not finish writing within checkpoint.timeout_s = %d s", late,
             m->coord->job->checkpoint.timeout_s);
    give_up(m, why, 1);
}

static commit *find_commit(ckpt_coord *c, long long step, int attempt) {
    for (commit *m = c->commits; m; m = m->next)
        if (m->step == step && m->attempt == attempt) return m;
    return NULL;
}

static commit *open_commit(ckpt_coord *c, long long step, int attempt, int sync) {
    commit *m = find_commit(c, step, attempt);
    if (m) return m;
    char name[128];
    m = calloc(1, sizeof *m);
    if (m) m->ranks = calloc((size_t)c->n_files, sizeof *m->ranks);
    if (m && m->ranks) m->deadline = evtimer_new(c->opt.base, on_deadline, m);
    if (!m || !m->deadline || ckpt_partial_name(name, sizeof name, step, attempt) ||
        path_join(m->partial, sizeof m->partial, c->job->checkpoint.dir, name, NULL)) {
        if (m && m->deadline) event_free(m->deadline);
        if (m) free(m->ranks);
        free(m);
        c->opt.hooks.fatal(c->opt.hooks.arg, "checkpoint coordinator: out of memory");
        return NULL;
    }
    m->coord = c;
    m->step = step;
    m->attempt = attempt;
    m->sync = sync;
    m->started = clock_now_s();
    commit **tail = &c->commits;
    while (*tail) tail = &(*tail)->next;
    *tail = m;
    arm_ready(c);
    log_event(-1, "checkpoint of step %lld (%s) into %s%s", step, sync ? "sync" : "async", m->partial,
              m->armed ? "" : "; its deadline starts once the save before it is written");
    return m;
}

/* The manifest's model_path: the job's model directory, absolute so that a consolidation
 * run from another directory finds it ("" for init random).  realpath fails only when the
 * directory went away after the model was loaded: then the path as the job gave it. */
static void record_model_path(const job_config *j, char *out, size_t n) {
    char abs[PATH_BYTES];
    const char *path = j->model.init == JOB_INIT_RANDOM ? "" : j->model.path;
    if (path[0] && realpath(path, abs)) path = abs;
    snprintf(out, n, "%s", path);
}

/* The manifest of a commit whose files are all in. */
static int build_manifest(const commit *m, ckpt_manifest *man, errbuf *err) {
    const ckpt_coord *c = m->coord;
    const job_config *j = c->job;
    memset(man, 0, sizeof *man);
    man->step = m->step;
    man->optimizer_step = m->optimizer_step;
    man->global_sample = m->step * j->train.global_batch;
    man->tokens_seen = m->tokens_seen;
    man->seed = j->train.seed;
    man->global_batch = j->train.global_batch;
    man->world_size = c->opt.world;
    snprintf(man->sharding, sizeof man->sharding, "%s", job_sharding_name(j->fsdp.sharding));
    job_train_settings(j, &man->train);
    man->train.total_steps = c->total_steps;
    man->model_config = json_incref(c->opt.model_config);
    record_model_path(j, man->model_path, sizeof man->model_path);
    if (j->train.type != JOB_TRAIN_FULL) {
        man->has_adapter = 1;
        job_adapter(j, c->opt.base_fingerprint ? c->opt.base_fingerprint : "", &man->adapter);
    }
    if (c->opt.identity) {
        man->has_identity = 1;
        man->identity = *c->opt.identity;
    }
    if (!m->units) return errf(err, "rank 0 sent no layout");
    if (ckpt_layout_from_json(&man->layout, m->units, c->n_files, "rank 0's layout", err)) return -1;
    man->files = calloc((size_t)c->n_files, sizeof *man->files);
    if (!man->files) return errf(err, "out of memory");
    for (int r = 0; r < c->n_files; r++) {
        ckpt_file_entry *f = &man->files[r];
        snprintf(f->name, sizeof f->name, "%s", m->ranks[r].file);
        f->rank = r;
        f->bytes = m->ranks[r].bytes;
        f->header_crc = m->ranks[r].header_crc;
    }
    return 0;
}

/* Writes the manifest (checked by reading it back and against every file's header). */
static int write_manifest(const commit *m, errbuf *err) {
    ckpt_manifest man, check;
    char *text = NULL, path[PATH_BYTES];
    int rc = build_manifest(m, &man, err);
    if (rc == 0) rc = ckpt_manifest_to_json(&man, &text, err);
    ckpt_manifest_free(&man);
    if (rc == 0) rc = path_join(path, sizeof path, m->partial, CKPT_MANIFEST, err);
    if (rc == 0 && (rc = ckpt_manifest_parse(&check, text, strlen(text), path, err)) == 0) {
        rc = ckpt_verify(m->partial, &check, 0, err);
        ckpt_manifest_free(&check);
    }
    if (rc == 0) {
        file_chunk chunks[] = {{text, strlen(text)}, {"\n", 1}};
        rc = file_write_atomic(path, chunks, 2, err);
    }
    free(text);
    return rc;
}

/* Puts the committed directory in place of step-N (an existing one is swapped out
 * atomically, then removed). */
static int move_into_place(const char *partial, const char *final, errbuf *err) {
    if (rename(partial, final) == 0) return 0;
    if (errno != EEXIST && errno != ENOTEMPTY) return errf(err, "rename %s -> %s: %s", partial, final, strerror(errno));
    if (renameat2(AT_FDCWD, partial, AT_FDCWD, final, RENAME_EXCHANGE) == 0) return file_remove_tree(partial, err);
    if (errno != EINVAL && errno != ENOSYS)
        return errf(err, "exchange %s <-> %s: %s", partial, final, strerror(errno));
    /* A file system without RENAME_EXCHANGE: a short window without step-N. */
    if (file_remove_tree(final, err)) return -1;
    if (rename(partial, final) != 0) return errf(err, "rename %s -> %s: %s", partial, final, strerror(errno));
    return 0;
}

/* latest -> name, by renaming a new symlink over it. */
static int point_latest(const char *dir, const char *name, errbuf *err) {
    char tmp[PATH_BYTES], latest[PATH_BYTES];
    if (snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%d", dir, CKPT_LATEST, (int)getpid()) >= (int)sizeof tmp ||
        path_join(latest, sizeof latest, dir, CKPT_LATEST, err))
        return errf(err, "%s: path too long", dir);
    unlink(tmp);
    if (symlink(name, tmp) != 0) return errf(err, "%s: symlink: %s", tmp, strerror(errno));
    if (rename(tmp, latest) != 0) {
        int e = errno;
        unlink(tmp);
        return errf(err, "%s: rename: %s", latest, strerror(e));
    }
    return file_fsync_dir(dir, 1, err);
}

/* Removes the oldest committed checkpoints beyond checkpoint.keep (never `latest`'s). */
static void prune(ckpt_coord *c) {
    const char *dir = c->job->checkpoint.dir;
    int64_t *steps;
    int n;
    errbuf err;
    if (ckpt_list(dir, &steps, &n, &err)) {
        log_event(-1, "cannot list the checkpoints: %s", err.msg);
        return;
    }
    for (int i = 0; i < n - c->job->checkpoint.keep; i++) {
        char name[64], path[PATH_BYTES];
        if (steps[i] == c->latest_step || ckpt_step_name(name, sizeof name, steps[i]) ||
            path_join(path, sizeof path, dir, name, &err))
            continue;
        if (file_remove_tree(path, &err)) log_event(-1, "%s", err.msg);
        else log_event(-1, "removed %s (checkpoint.keep = %d)", path, c->job->checkpoint.keep);
    }
    free(steps);
    if (file_fsync_dir(dir, 1, &err)) log_event(-1, "%s", err.msg);
}

static int commit_files(commit *m, errbuf *err) {
    ckpt_coord *c = m->coord;
    const char *dir = c->job->checkpoint.dir;
    char name[64], final[PATH_BYTES];
    if (write_manifest(m, err) || ckpt_step_name(name, sizeof name, m->step) ||
        path_join(final, sizeof final, dir, name, err) || move_into_place(m->partial, final, err) ||
        file_fsync_dir(dir, 1, err))
        return -1;
    if (m->step >= c->latest_step) {
        if (point_latest(dir, name, err)) return -1;
        c->latest_step = m->step;
    }
    uint64_t bytes = 0;
    for (int r = 0; r < c->n_files; r++) bytes += m->ranks[r].bytes;
    log_event(-1, "checkpoint %s committed: %d file%s, %.1f MB, %.2f s after the step", final,
              c->n_files, c->n_files == 1 ? "" : "s", (double)bytes / 1e6, clock_now_s() - m->started);
    prune(c);
    return 0;
}

void ckpt_coord_on_metrics(ckpt_coord *c, const msg_metrics *metrics) {
    c->total_steps = metrics->total_steps;
    if (!metrics->has_checkpoint) return;
    const msg_ckpt_note *ck = &metrics->checkpoint;
    if (ck->attempt != c->opt.attempt) {
        log_event(0, "ignoring a checkpoint announcement of attempt %d (this run's is %d)", ck->attempt,
                  c->opt.attempt);
        return;
    }
    if (!strcmp(ck->mode, "skipped")) {
        log_event(-1, "checkpoint of step %lld skipped: a previous save is still being written",
                  (long long)ck->step);
        return;
    }
    open_commit(c, ck->step, ck->attempt, !strcmp(ck->mode, "sync"));
}

/* Takes rank's report into m: 0, or -1 when it reported already. */
static int record_report(commit *m, int rank, const msg_ckpt_done *b) {
    rank_report *r = &m->ranks[rank];
    if (r->reported) {
        log_event(rank, "ignoring a second CKPT_DONE%s for step %lld", b->memory ? " (memory)" : "", m->step);
        return -1;
    }
    r->reported = 1;
    m->n_reported++;
    r->ok = b->ok;
    snprintf(r->file, sizeof r->file, "%s", b->file);
    r->bytes = (uint64_t)b->bytes;
    r->header_crc = (uint32_t)b->header_crc32c;
    r->stage_s = b->stage_s;
    r->write_s = b->write_s;
    if (rank == 0 && r->ok) {
        m->units = json_incref(b->units);
        m->optimizer_step = b->optimizer_step;
        m->tokens_seen = b->tokens_seen;
    }
    return 0;
}

/* The memory manifest (memory_ckpt.h) of a memory save every rank sealed: in checkpoint.dir,
 * replacing the one before (tmp + rename). */
static int write_memory_manifest(const commit *m, errbuf *err) {
    ckpt_manifest man;
    char *text = NULL, path[PATH_BYTES];
    int rc = build_manifest(m, &man, err);
    if (rc == 0) rc = ckpt_manifest_to_json(&man, &text, err);
    ckpt_manifest_free(&man);
    if (rc == 0) rc = path_join(path, sizeof path, m->coord->job->checkpoint.dir, CKPT_MEMORY_MANIFEST, err);
    if (rc == 0) {
        file_chunk chunks[] = {{text, strlen(text)}, {"\n", 1}};
        rc = file_write_atomic(path, chunks, 2, err);
    }
    free(text);
    return rc;
}

/* The first in-memory save kept, then one line a minute at most: how many since, the newest,
 * and what the last cost (its longest staging: training's stall; its longest sealing). */
static void log_memory_save(ckpt_coord *c, const commit *m) {
    double now = clock_now_s(), stage = 0, seal = 0;
    c->memory_saves++;
    if (c->memory_step >= 0 && now - c->memory_logged < 60) return;
    for (int r = 0; r < c->n_files; r++) {
        if (m->ranks[r].stage_s > stage) stage = m->ranks[r].stage_s;
        if (m->ranks[r].write_s > seal) seal = m->ranks[r].write_s;
    }
    log_event(-1, "in-memory checkpoint of step %lld kept (%lld since the last line; every rank's image sealed: "
                  "staged in %.3f s, sealed in %.3f s)", m->step, c->memory_saves, stage, seal);
    c->memory_saves = 0;
    c->memory_logged = now;
}

/* A rank's image in memory holds step b->step, sealed (every save sends one of these first). */
static void on_memory_done(ckpt_coord *c, int rank, const msg_ckpt_done *b) {
    commit *m = c->memory;
    if (!b->ok || (m && m->step > b->step) || b->step <= c->memory_step) return; /* an older one, late */
    if (m && m->step < b->step) { /* a rank is on to the next: this one will never be whole */
        free_commit(m);
        m = c->memory = NULL;
    }
    if (!m) {
        m = c->memory = calloc(1, sizeof *m);
        if (m && !(m->ranks = calloc((size_t)c->n_files, sizeof *m->ranks))) {
            free(m);
            m = c->memory = NULL;
        }
        if (!m) {
            c->opt.hooks.fatal(c->opt.hooks.arg, "checkpoint coordinator: out of memory");
            return;
        }
        *m = (commit){.coord = c, .step = b->step, .attempt = b->attempt, .ranks = m->ranks};
    }
    if (record_report(m, rank, b) || m->n_reported < c->n_files) return;
    errbuf err;
    if (write_memory_manifest(m, &err)) log_event(-1, "in-memory checkpoint of step %lld not kept: %s", m->step, err.msg);
    else {
        log_memory_save(c, m);
        c->memory_step = m->step;
    }
    free_commit(m);
    c->memory = NULL;
}

void ckpt_coord_on_done(ckpt_coord *c, int rank, const msg_ckpt_done *b) {
    long long step = b->step;
    if (b->attempt != c->opt.attempt || rank >= c->n_files) {
        log_event(rank, "ignoring a CKPT_DONE of attempt %d (this run's is %d; %d shard files)",
                  b->attempt, c->opt.attempt, c->n_files);
        return;
    }
    if (b->memory) {
        on_memory_done(c, rank, b);
        return;
    }
    commit *m = open_commit(c, step, b->attempt, b->sync);
    if (!m || record_report(m, rank, b)) return;
    rank_report *r = &m->ranks[rank];
    if (r->ok)
        log_event(rank, "wrote %s of step %lld: %.1f MB (staged in %.3f s, written in %.3f s)", b->file, step,
                  (double)r->bytes / 1e6, b->stage_s, b->write_s);
    if (m->abandoned) {
        if (m->n_reported == c->n_files) {
            log_event(-1, "removing %s: its writers have stopped", m->partial);
            remove_partial(m);
            free_commit(m);
            arm_ready(c);
        }
        return;
    }
    if (!r->ok) {
        char why[1200];
        snprintf(why, sizeof why, "rank %d %s: %s", rank,
                 b->aborted ? "stopped writing" : "could not write its shard", b->error);
        give_up(m, why, 0);
        return;
    }
    if (m->n_reported < c->n_files) return;
    errbuf err;
    if (commit_files(m, &err)) {
        char why[1200];
        snprintf(why, sizeof why, "commit failed: %s", err.msg);
        m->n_reported = c->n_files; /* nobody is writing any more */
        give_up(m, why, 0);
        return;
    }
    free_commit(m);
    c->failed_saves = 0;
    c->retry_pending = 0;
    arm_ready(c);
    if (c->opt.hooks.settled) c->opt.hooks.settled(c->opt.hooks.arg, step, 1);
}

static long long request_save(ckpt_coord *c, const char *why, int stop, int sync) {
    long long id = ++c->requests;
    log_event(-1, "checkpoint requested (%s): asking the workers (request %lld%s)", why, id,
              stop ? ", synchronous, then stop" : sync ? ", synchronous" : "");
    msg begin = {.type = MSG_CKPT_BEGIN, .u.ckpt_begin = {.request = id, .stop = stop != 0, .sync = sync != 0}};
    c->opt.hooks.broadcast(c->opt.hooks.arg, &begin);
    return id;
}

long long ckpt_coord_request(ckpt_coord *c, const char *why, int stop) { return request_save(c, why, stop, 0); }

int ckpt_coord_finish(ckpt_coord *c) {
    int open = 0;
    while (c->commits) {
        commit *m = c->commits;
        if (!m->abandoned) {
            char late[256];
            late_ranks(m, late, sizeof late);
            log_event(-1, "checkpoint of step %lld never committed: %s did not report", m->step, late);
            open++;
        }
        remove_partial(m);
        free_commit(m);
    }
    return open;
}
