/* msg bodies: the table of every message's fields, the encoder and the strict decoder.
 * See msg.h. */
#include "msg.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_kind.h"

typedef enum field_kind {
    F_INT,    /* int, in [lo, hi] */
    F_I64,    /* int64_t, in [lo, hi] */
    F_F64,    /* double, finite */
    F_BOOL,   /* bool */
    F_STR,    /* char[size], NUL-terminated */
    F_JSON,   /* json_t *, an array or object checked by its own decoder */
    F_SUB,    /* a nested struct of `sub`'s fields */
    F_JOB,    /* job_config */
    F_MODEL,  /* llama_config */
    F_ADDRS,  /* msg_peers: a list of addresses */
    F_NODES,  /* msg_nodes: distinct node indices */
} field_kind;

typedef struct body_info body_info;

/* One field of a body: its JSON name, kind, place and size in the struct, bounds, and for
 * an optional field the place of the bool that says whether it is present. */
typedef struct field {
    const char *name;
    field_kind kind;
    size_t off, size;
    long long lo, hi;
    bool optional;
    size_t has;
    const body_info *sub;
} field;

struct body_info {
    const field *fields;
    int n;
    /* Cross-field rules, after every field decoded (NULL: none). */
    int (*check)(void *body, const char *type, errbuf *err);
};

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))
#define SIZE(T, m) sizeof(((T *)0)->m)
#define INT(T, name, m, lo, hi) {name, F_INT, offsetof(T, m), SIZE(T, m), lo, hi, false, 0, NULL}
#define I64(T, name, m, lo) {name, F_I64, offsetof(T, m), SIZE(T, m), lo, LLONG_MAX, false, 0, NULL}
#define F64(T, name, m) {name, F_F64, offsetof(T, m), SIZE(T, m), 0, 0, false, 0, NULL}
#define BOOL(T, name, m) {name, F_BOOL, offsetof(T, m), SIZE(T, m), 0, 0, false, 0, NULL}
#define STR(T, name, m) {name, F_STR, offsetof(T, m), SIZE(T, m), 0, 0, false, 0, NULL}
#define OF(T, name, m, kind) {name, kind, offsetof(T, m), SIZE(T, m), 0, 0, false, 0, NULL}
/* Optional: the struct has a bool has_<m>. */
#define OPT_I64(T, name, m, lo) \
    {name, F_I64, offsetof(T, m), SIZE(T, m), lo, LLONG_MAX, true, offsetof(T, has_##m), NULL}
#define OPT_F64(T, name, m) {name, F_F64, offsetof(T, m), SIZE(T, m), 0, 0, true, offsetof(T, has_##m), NULL}
#define OPT_SUB(T, name, m, info) \
    {name, F_SUB, offsetof(T, m), SIZE(T, m), 0, 0, true, offsetof(T, has_##m), &info}

static const field hello_fields[] = {INT(msg_hello, "pid", pid, 1, INT_MAX)};

static int check_config(void *body, const char *type, errbuf *err);
static const field config_fields[] = {
    INT(msg_config, "rank", rank, 0, INT_MAX),
    INT(msg_config, "world", world, 1, INT_MAX),
    INT(msg_config, "local_rank", local_rank, 0, INT_MAX),
    INT(msg_config, "node", node, 0, INT_MAX),
    STR(msg_config, "bind_host", bind_host),
    STR(msg_config, "secret", secret),
    OF(msg_config, "job", job, F_JOB),
    OF(msg_config, "model", model, F_MODEL),
    INT(msg_config, "ckpt_attempt", ckpt_attempt, 1, INT_MAX),
    STR(msg_config, "resume_dir", resume_dir),
    INT(msg_config, "memory_fd", memory_fd, -1, INT_MAX),
    INT(msg_config, "memory_slots", memory_slots, 0, 2),
    BOOL(msg_config, "memory_resume", memory_resume),
    INT(msg_config, "model_fd", model_fd, -1, INT_MAX),
    {"samples", F_JSON, offsetof(msg_config, samples), sizeof(json_t *), 0, 0, true, 0, NULL},
};

static const field coll_fields[] = {
    I64(msg_coll, "started", started, 0),
    I64(msg_coll, "finished", finished, 0),
    STR(msg_coll, "op", op),
    INT(msg_coll, "unit", unit, -1, INT_MAX),
};
static const body_info coll_info = {coll_fields, COUNT(coll_fields), NULL};

static const field net_fields[] = {
    STR(msg_net, "transport", transport),
    BOOL(msg_net, "measured", measured),
    F64(msg_net, "busbw_gbps", busbw_gbps),
};
static const body_info net_info = {net_fields, COUNT(net_fields), NULL};

static const field timing_fields[] = {
    I64(msg_timing, "steps", steps, 1),
    F64(msg_timing, "step_s", step_s),
    F64(msg_timing, "comm_s", comm_s),
    F64(msg_timing, "data_s", data_s),
};
static int check_timing(void *body, const char *type, errbuf *err);
static const body_info timing_info = {timing_fields, COUNT(timing_fields), check_timing};

static const field heartbeat_fields[] = {
    BOOL(msg_heartbeat, "ready", ready),
    OPT_I64(msg_heartbeat, "step", step, 0),
    OPT_I64(msg_heartbeat, "progress", progress, 0),
    OPT_I64(msg_heartbeat, "mem_bytes", mem_bytes, 0),
    OPT_SUB(msg_heartbeat, "coll", coll, coll_info),
    OPT_SUB(msg_heartbeat, "net", net, net_info),
    OPT_SUB(msg_heartbeat, "timing", timing, timing_info),
};

static int check_ckpt_mode(void *body, const char *type, errbuf *err);
static const field ckpt_note_fields[] = {
    I64(msg_ckpt_note, "step", step, 1),
    INT(msg_ckpt_note, "attempt", attempt, 1, INT_MAX),
    STR(msg_ckpt_note, "mode", mode),
    I64(msg_ckpt_note, "request", request, 0),
};
static const body_info ckpt_note_info = {ckpt_note_fields, COUNT(ckpt_note_fields), check_ckpt_mode};

static const field metrics_fields[] = {
    I64(msg_metrics, "step", step, 1),
    I64(msg_metrics, "total_steps", total_steps, 0),
    F64(msg_metrics, "loss", loss),
    F64(msg_metrics, "lr", lr),
    F64(msg_metrics, "grad_norm", grad_norm),
    I64(msg_metrics, "tokens", tokens, 0),
    I64(msg_metrics, "tokens_seen", tokens_seen, 0),
    F64(msg_metrics, "seconds", seconds),
    I64(msg_metrics, "layer_forwards", layer_forwards, 0),
    I64(msg_metrics, "mem_bytes", mem_bytes, 0),
    I64(msg_metrics, "mem_peak_bytes", mem_peak_bytes, 0),
    I64(msg_metrics, "all_gathers", all_gathers, 0),
    I64(msg_metrics, "replica_collectives", replica_collectives, 0),
    I64(msg_metrics, "gathered_bytes", gathered_bytes, 0),
    OPT_SUB(msg_metrics, "checkpoint", checkpoint, ckpt_note_info),
    OPT_F64(msg_metrics, "eval_loss", eval_loss),
    OPT_F64(msg_metrics, "rewards/chosen", rewards_chosen),
    OPT_F64(msg_metrics, "rewards/rejected", rewards_rejected),
    OPT_F64(msg_metrics, "rewards/accuracies", rewards_accuracies),
    OPT_F64(msg_metrics, "rewards/margins", rewards_margins),
    OPT_F64(msg_metrics, "logps/chosen", logps_chosen),
    OPT_F64(msg_metrics, "logps/rejected", logps_rejected),
    OPT_F64(msg_metrics, "nll_loss", nll_loss),
    OPT_F64(msg_metrics, "log_odds_ratio", log_odds_ratio),
    OPT_F64(msg_metrics, "log_odds_chosen", log_odds_chosen),
};

static const field ckpt_begin_fields[] = {
    I64(msg_ckpt_begin, "request", request, 1),
    BOOL(msg_ckpt_begin, "stop", stop),
    BOOL(msg_ckpt_begin, "sync", sync),
};

static const field ckpt_done_fields[] = {
    I64(msg_ckpt_done, "step", step, 1),
    INT(msg_ckpt_done, "attempt", attempt, 1, INT_MAX),
    INT(msg_ckpt_done, "rank", rank, 0, INT_MAX),
    BOOL(msg_ckpt_done, "sync", sync),
    BOOL(msg_ckpt_done, "ok", ok),
    BOOL(msg_ckpt_done, "aborted", aborted),
    BOOL(msg_ckpt_done, "memory", memory),
    STR(msg_ckpt_done, "error", error),
    STR(msg_ckpt_done, "file", file),
    I64(msg_ckpt_done, "bytes", bytes, 0),
    {"header_crc32c", F_I64, offsetof(msg_ckpt_done, header_crc32c), 8, 0, UINT32_MAX, false, 0, NULL},
    F64(msg_ckpt_done, "stage_s", stage_s),
    F64(msg_ckpt_done, "write_s", write_s),
    OPT_I64(msg_ckpt_done, "optimizer_step", optimizer_step, 0),
    OPT_I64(msg_ckpt_done, "tokens_seen", tokens_seen, 0),
    {"units", F_JSON, offsetof(msg_ckpt_done, units), sizeof(json_t *), 0, 0, true, 0, NULL},
};

static const field ckpt_abort_fields[] = {
    I64(msg_ckpt_abort, "step", step, 1),
    INT(msg_ckpt_abort, "attempt", attempt, 1, INT_MAX),
    INT(msg_ckpt_abort, "rank", rank, 0, INT_MAX),
};

static const field stop_fields[] = {STR(msg_stop, "reason", reason), BOOL(msg_stop, "failed", failed),
                                    BOOL(msg_stop, "permanent", permanent)};
static const field fatal_fields[] = {
    STR(msg_fatal, "message", message),
    BOOL(msg_fatal, "permanent", permanent),
};
static const field addr_fields[] = {STR(msg_addr, "addr", addr)};
static const field peers_fields[] = {OF(msg_peers, "addrs", n, F_ADDRS)};

static int check_join(void *body, const char *type, errbuf *err);
static const field join_fields[] = {
    INT(msg_join, "node", node, 0, INT_MAX),
    INT(msg_join, "nodes", nodes, 1, INT_MAX),
    INT(msg_join, "slurm_node", slurm_node, 0, INT_MAX),
    BOOL(msg_join, "standby", standby),
    STR(msg_join, "host", host),
    INT(msg_join, "workers", workers, 1, INT_MAX),
    STR(msg_join, "nonce", nonce),
    I64(msg_join, "memory_step", memory_step, -1),
    INT(msg_join, "replica_port", replica_port, 0, 65535),
    {"settings", F_JSON, offsetof(msg_join, settings), sizeof(json_t *), 0, 0, false, 0, NULL},
};

static int check_rendezvous(void *body, const char *type, errbuf *err);
static const field rendezvous_fields[] = {
    STR(msg_rendezvous, "host", host),
    INT(msg_rendezvous, "port", port, 0, 65535),
    INT(msg_rendezvous, "nodes", nodes, 1, INT_MAX),
    STR(msg_rendezvous, "job_id", job_id),
    INT(msg_rendezvous, "restart", restart, 0, INT_MAX),
    INT(msg_rendezvous, "attempt", attempt, 0, INT_MAX),
    STR(msg_rendezvous, "secret", secret),
    STR(msg_rendezvous, "nonce", nonce),
    STR(msg_rendezvous, "launch", launch),
    OF(msg_rendezvous, "members", members, F_NODES),
    STR(msg_rendezvous, "ended", ended),
};

static const field refused_fields[] = {STR(msg_refused, "reason", reason)};

static int check_sample(void *body, const char *type, errbuf *err);
static const field sample_fields[] = {
    I64(msg_sample, "step", step, 1),
    INT(msg_sample, "prompt_index", prompt_index, 0, INT_MAX),
    {"reply_ids", F_JSON, offsetof(msg_sample, reply_ids), sizeof(json_t *), 0, 0, false, 0, NULL},
    STR(msg_sample, "stop", stop),
};

static const field node_addrs_fields[] = {
    INT(msg_node_addrs, "node", node, 0, INT_MAX),
    OF(msg_node_addrs, "addrs", list, F_ADDRS),
};

static const field node_ready_fields[] = {INT(msg_node, "node", node, 0, INT_MAX)};

static const field node_done_fields[] = {
    INT(msg_node_done, "node", node, 0, INT_MAX),
    BOOL(msg_node_done, "ok", ok),
    BOOL(msg_node_done, "permanent", permanent),
    STR(msg_node_done, "error", error),
};

static int check_node_heartbeat(void *body, const char *type, errbuf *err);
static const field node_heartbeat_fields[] = {
    INT(msg_node_heartbeat, "node", node, 0, INT_MAX),
    STR(msg_node_heartbeat, "state", state),
    {"ranks", F_JSON, offsetof(msg_node_heartbeat, ranks), sizeof(json_t *), 0, 0, true, 0, NULL},
    {"progress", F_JSON, offsetof(msg_node_heartbeat, progress), sizeof(json_t *), 0, 0, true, 0, NULL},
};

static int check_ckpt_request(void *body, const char *type, errbuf *err);
static const field ckpt_request_fields[] = {
    STR(msg_ckpt_request, "kind", kind),
    STR(msg_ckpt_request, "why", why),
};

static const field plan_fields[] = {
    INT(msg_plan, "attempt", attempt, 1, INT_MAX),
    STR(msg_plan, "resume_dir", resume_dir),
    I64(msg_plan, "memory_step", memory_step, -1),
    {"replicas", F_ADDRS, offsetof(msg_plan, replicas), sizeof(msg_peers), 0, 0, true, offsetof(msg_plan, has_replicas), NULL},
    STR(msg_plan, "error", error),
};

#define BODY(f) {f, COUNT(f), NULL}
/* Every type's body; NCCL_ID's is raw bytes (n < 0). */
static const body_info bodies[MSG_TYPE_END] = {
    [MSG_HELLO] = BODY(hello_fields),
    [MSG_CONFIG] = {config_fields, COUNT(config_fields), check_config},
    [MSG_NCCL_ID] = {NULL, -1, NULL},
    [MSG_START] = {NULL, 0, NULL},
    [MSG_HEARTBEAT] = BODY(heartbeat_fields),
    [MSG_METRICS] = BODY(metrics_fields),
    [MSG_CKPT_BEGIN] = BODY(ckpt_begin_fields),
    [MSG_CKPT_DONE] = BODY(ckpt_done_fields),
    [MSG_CKPT_ABORT] = BODY(ckpt_abort_fields),
    [MSG_STOP] = BODY(stop_fields),
    [MSG_FATAL] = BODY(fatal_fields),
    [MSG_ADDR] = BODY(addr_fields),
    [MSG_PEERS] = BODY(peers_fields),
    [MSG_JOIN] = {join_fields, COUNT(join_fields), check_join},
    [MSG_NODE_HEARTBEAT] = {node_heartbeat_fields, COUNT(node_heartbeat_fields), check_node_heartbeat},
    [MSG_CKPT_REQUEST] = {ckpt_request_fields, COUNT(ckpt_request_fields), check_ckpt_request},
    [MSG_PLAN] = BODY(plan_fields),
    [MSG_RENDEZVOUS] = {rendezvous_fields, COUNT(rendezvous_fields), check_rendezvous},
    [MSG_NODE_ADDRS] = BODY(node_addrs_fields),
    [MSG_NODE_READY] = BODY(node_ready_fields),
    [MSG_NODE_DONE] = BODY(node_done_fields),
    [MSG_REFUSED] = BODY(refused_fields),
    [MSG_SAMPLE] = {sample_fields, COUNT(sample_fields), check_sample},
};

static int check_config(void *body, const char *type, errbuf *err) {
    msg_config *c = body;
    if (c->rank >= c->world)
        return errf(err, "%s: rank %d is not below world %d", type, c->rank, c->world);
    if (strlen(c->secret) != 2 * MSG_SECRET_BYTES || strspn(c->secret, "0123456789abcdef") != 2 * MSG_SECRET_BYTES)
        return errf(err, "%s: field 'secret' must be %d lower-case hex digits", type, 2 * MSG_SECRET_BYTES);
    /* The job arrives resolved, but without grad_accum (job_to_object leaves derived fields
     * out): job_resolve recomputes it, and fills nothing else of a resolved job. */
    if (job_resolve(&c->job, c->world, err) || job_validate(&c->job, c->world, err))
        return errprefix(err, "%s: field 'job'", type);
    if (!c->samples) return 0;
    msg_sample_prompts p;
    if (msg_sample_prompts_read(c->samples, c->model.vocab_size, &p, err))
        return errprefix(err, "%s: field 'samples'", type);
    msg_sample_prompts_free(&p);
    return 0;
}

static int check_sample(void *body, const char *type, errbuf *err) {
    msg_sample *m = body;
    if (strcmp(m->stop, "stop") && strcmp(m->stop, "length") && strcmp(m->stop, "positions"))
        return errf(err, "%s: field 'stop' is \"%s\", not stop, length or positions", type, m->stop);
    int32_t *ids;
    int n;
    if (msg_ids_read(m->reply_ids, &ids, &n, err)) return errprefix(err, "%s: field 'reply_ids'", type);
    free(ids);
    return 0;
}

/* ---- token ids (SAMPLE's reply, CONFIG's samples) ---- */

json_t *msg_ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i]))) a = (json_decref(a), NULL);
    return a;
}

int msg_ids_read(const json_t *a, int32_t **ids, int *n, errbuf *err) {
    *ids = NULL;
    *n = 0;
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > INT32_MAX)
        return errf(err, "must be a non-empty array of token ids, got %s", json_kind(a));
    int32_t *v = malloc(json_array_size(a) * sizeof *v);
    if (!v) return errf(err, "out of memory");
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(v);
            return errf(err, "[%zu] is not a token id (an integer >= 0)", i);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *ids = v;
    *n = (int)json_array_size(a);
    return 0;
}

json_t *msg_sample_prompts_json(const msg_sample_prompts *p) {
    json_t *prompts = json_array(), *stop = msg_ids_json(p->stop, p->n_stop);
    for (int i = 0; prompts && i < p->n; i++)
        if (json_array_append_new(prompts, msg_ids_json(p->ids + p->offsets[i], p->offsets[i + 1] - p->offsets[i])))
            prompts = (json_decref(prompts), NULL);
    if (!prompts || !stop) {
        json_decref(prompts);
        json_decref(stop);
        return NULL;
    }
    return json_pack("{s:o, s:o}", "prompts", prompts, "stop_ids", stop);
}

void msg_sample_prompts_free(msg_sample_prompts *p) {
    free(p->ids);
    free(p->offsets);
    free(p->stop);
    memset(p, 0, sizeof *p);
}

/* Every id below vocab. */
static int ids_in_vocab(const int32_t *ids, int n, int vocab, errbuf *err) {
    for (int i = 0; i < n; i++)
        if (ids[i] >= vocab) return errf(err, "[%d] = %d is not below the vocabulary size %d", i, ids[i], vocab);
    return 0;
}

static int read_prompts(const json_t *a, int vocab, msg_sample_prompts *p, errbuf *err) {
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > INT_MAX / 2)
        return errf(err, "'prompts' must be a non-empty array, got %s", json_kind(a));
    p->n = (int)json_array_size(a);
    if (!(p->offsets = calloc((size_t)p->n + 1, sizeof *p->offsets))) return errf(err, "out of memory");
    size_t cap = 0;
    for (int i = 0; i < p->n; i++) {
        int32_t *ids;
        int n;
        if (msg_ids_read(json_array_get(a, (size_t)i), &ids, &n, err) || ids_in_vocab(ids, n, vocab, err)) {
            free(ids);
            return errprefix(err, "'prompts'[%d]", i);
        }
        if (n > INT_MAX - p->offsets[i]) {
            free(ids);
            return errf(err, "'prompts': too many ids");
        }
        p->offsets[i + 1] = p->offsets[i] + n;
        if ((size_t)p->offsets[i + 1] > cap) {
            cap = 2 * (size_t)p->offsets[i + 1];
            int32_t *grown = realloc(p->ids, cap * sizeof *grown);
            if (!grown) {
                free(ids);
                return errf(err, "out of memory");
            }
            p->ids = grown;
        }
        memcpy(p->ids + p->offsets[i], ids, (size_t)n * sizeof *ids);
        free(ids);
    }
    return 0;
}

int msg_sample_prompts_read(const json_t *j, int vocab, msg_sample_prompts *out, errbuf *err) {
    memset(out, 0, sizeof *out);
    if (!json_is_object(j) || json_object_size(j) != 2 || !json_object_get(j, "prompts") ||
        !json_object_get(j, "stop_ids"))
        return errf(err, "must be an object of exactly 'prompts' and 'stop_ids'");
    int rc = read_prompts(json_object_get(j, "prompts"), vocab, out, err);
    const json_t *stop = json_object_get(j, "stop_ids");
    if (rc == 0 && json_is_array(stop) && json_array_size(stop) == 0) return 0; /* no stop ids */
    if (rc == 0 && (msg_ids_read(stop, &out->stop, &out->n_stop, err) ||
                    ids_in_vocab(out->stop, out->n_stop, vocab, err)))
        rc = errprefix(err, "'stop_ids'");
    if (rc) msg_sample_prompts_free(out);
    return rc;
}

static int check_join(void *body, const char *type, errbuf *err) {
    if (!json_is_object(((msg_join *)body)->settings)) return errf(err, "%s: field 'settings' must be an object", type);
    return 0;
}

static int check_rendezvous(void *body, const char *type, errbuf *err) {
    const msg_rendezvous *r = body;
    if (r->members.n != r->nodes)
        return errf(err, "%s: field 'members' lists %d nodes, field 'nodes' says %d", type, r->members.n, r->nodes);
    if (r->members.id[0] != 0) return errf(err, "%s: field 'members' must begin with node 0, the leader", type);
    if (!r->ended[0] && r->port == 0) return errf(err, "%s: field 'port' is 0, and the launch has not ended", type);
    return 0;
}

static int check_timing(void *body, const char *type, errbuf *err) {
    const msg_timing *t = body;
    if (!(t->step_s >= 0 && t->comm_s >= 0 && t->data_s >= 0))
        return errf(err, "%s: field 'timing' needs step_s, comm_s and data_s >= 0", type);
    return 0;
}

static int check_ckpt_mode(void *body, const char *type, errbuf *err) {
    const char *mode = ((msg_ckpt_note *)body)->mode;
    if (strcmp(mode, "async") && strcmp(mode, "sync") && strcmp(mode, "skipped"))
        return errf(err, "%s: field 'checkpoint.mode' is \"%s\", not async, sync or skipped", type, mode);
    return 0;
}

/* A rank's collectives in a status row: {"started", "finished", "op", "unit"}. */
static int check_coll(const json_t *c) {
    const json_t *started = json_object_get(c, "started"), *finished = json_object_get(c, "finished");
    const json_t *unit = json_object_get(c, "unit");
    return !json_is_object(c) || json_object_size(c) != 4 || !json_is_integer(started) ||
           json_integer_value(started) < 0 || !json_is_integer(finished) || json_integer_value(finished) < 0 ||
           !json_is_string(json_object_get(c, "op")) || !json_is_integer(unit) || json_integer_value(unit) < -1;
}

/* One status row of a follower's rank: exactly these members. */
static int check_rank_row(const json_t *row, size_t i, const char *type, errbuf *err) {
    static const char *const memory[] = {"host_rss_bytes", "gpu_bytes"};
    if (!json_is_object(row)) return errf(err, "%s: ranks[%zu] is not an object", type, i);
    const json_t *rank = json_object_get(row, "rank"), *pid = json_object_get(row, "pid");
    if (!json_is_integer(rank) || json_integer_value(rank) < 0 || !json_is_integer(pid) ||
        !json_is_boolean(json_object_get(row, "running")))
        return errf(err, "%s: ranks[%zu] needs an integer 'rank' >= 0, an integer 'pid' and a boolean 'running'",
                    type, i);
    size_t known = 3;
    for (int k = 0; k < 2; k++) {
        const json_t *v = json_object_get(row, memory[k]);
        if (!v) continue;
        if (!json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) >= 0))
            return errf(err, "%s: ranks[%zu].%s must be a byte count or null", type, i, memory[k]);
        known++;
    }
    const json_t *coll = json_object_get(row, "coll"), *still = json_object_get(row, "coll_still_s");
    if (coll) {
        if (check_coll(coll) || !json_is_number(still) || json_number_value(still) < 0)
            return errf(err, "%s: ranks[%zu].coll must be {\"started\", \"finished\", \"op\", \"unit\"} with a "
                        "'coll_still_s' >= 0", type, i);
        known += 2;
    }
    const json_t *net = json_object_get(row, "net");
    if (net) {
        const json_t *bw = json_object_get(net, "busbw_gbps");
        if (!json_is_object(net) || json_object_size(net) != 2 || !json_is_string(json_object_get(net, "transport")) ||
            !(json_is_null(bw) || json_is_number(bw)))
            return errf(err, "%s: ranks[%zu].net must be {\"transport\", \"busbw_gbps\"}", type, i);
        known++;
    }
    const json_t *timing = json_object_get(row, "timing");
    if (timing) { /* the stragglers' watch's figures: msg_timing's */
        static const char *const seconds[] = {"step_s", "comm_s", "data_s"};
        const json_t *steps = json_object_get(timing, "steps");
        int bad = !json_is_object(timing) || json_object_size(timing) != 4 || !json_is_integer(steps) ||
                  json_integer_value(steps) < 1;
        for (int k = 0; !bad && k < 3; k++) {
            const json_t *v = json_object_get(timing, seconds[k]);
            bad = !json_is_number(v) || json_number_value(v) < 0;
        }
        if (bad)
            return errf(err, "%s: ranks[%zu].timing must be {\"steps\" >= 1, \"step_s\", \"comm_s\", \"data_s\" >= 0}",
                        type, i);
        known++;
    }
    const json_t *progress = json_object_get(row, "progress");
    if (progress) { /* the stall watch's figures (fsdpd's supervisor) */
        const json_t *work = json_object_get(progress, "work"), *step = json_object_get(progress, "step");
        const json_t *moved = json_object_get(progress, "still_s");
        if (!json_is_object(progress) || json_object_size(progress) != 3 || !json_is_integer(work) ||
            json_integer_value(work) < 1 || !json_is_integer(step) || json_integer_value(step) < 0 ||
            !json_is_number(moved) || json_number_value(moved) < 0)
            return errf(err, "%s: ranks[%zu].progress must be {\"work\" >= 1, \"step\" >= 0, \"still_s\" >= 0}",
                        type, i);
        known++;
    }
    if (json_object_size(row) != known) return errf(err, "%s: ranks[%zu] has an unknown member", type, i);
    return 0;
}

static int check_node_heartbeat(void *body, const char *type, errbuf *err) {
    const json_t *progress = ((msg_node_heartbeat *)body)->progress;
    if (progress) { /* a METRICS body, as strict as the message */
        msg metrics;
        if (msg_from_json(&metrics, MSG_METRICS, progress, err)) return errprefix(err, "%s: field 'progress'", type);
        msg_free(&metrics);
    }
    const json_t *ranks = ((msg_node_heartbeat *)body)->ranks;
    if (!ranks) return 0;
    if (!json_is_array(ranks)) return errf(err, "%s: field 'ranks' must be an array", type);
    size_t i;
    const json_t *row;
    json_array_foreach(ranks, i, row) if (check_rank_row(row, i, type, err)) return -1;
    return 0;
}

static int check_ckpt_request(void *body, const char *type, errbuf *err) {
    const char *kind = ((msg_ckpt_request *)body)->kind;
    if (strcmp(kind, "checkpoint") && strcmp(kind, "stop") && strcmp(kind, "stop_sync"))
        return errf(err, "%s: field 'kind' is \"%s\", not checkpoint, stop or stop_sync", type, kind);
    return 0;
}

/* ---- freeing ---- */

static void free_body(const body_info *info, void *body) {
    for (int i = 0; i < info->n; i++) {
        const field *f = &info->fields[i];
        char *at = (char *)body + f->off;
        if (f->kind == F_JSON) {
            json_decref(*(json_t **)at);
            *(json_t **)at = NULL;
        } else if (f->kind == F_ADDRS) {
            msg_peers *p = (msg_peers *)at;
            free(p->addrs);
            p->addrs = NULL;
            p->n = 0;
        } else if (f->kind == F_SUB) {
            free_body(f->sub, at);
        }
    }
}

void msg_free(msg *m) {
    if (m->type > 0 && m->type < MSG_TYPE_END && bodies[m->type].n > 0) free_body(&bodies[m->type], &m->u);
}

/* ---- encoding ---- */

static json_t *addrs_json(const msg_peers *p) {
    json_t *a = json_array();
    for (int i = 0; a && i < p->n; i++)
        if (json_array_append_new(a, json_string(p->addrs[i]))) a = (json_decref(a), NULL);
    return a;
}

void msg_nodes_list(const msg_nodes *n, char *out, size_t size) {
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; i < n->n && at < size; i++) at += (size_t)snprintf(out + at, size - at, "%s%d", i ? ", " : "", n->id[i]);
}

static json_t *nodes_json(const msg_nodes *p) {
    json_t *a = json_array();
    for (int i = 0; a && i < p->n; i++)
        if (json_array_append_new(a, json_integer(p->id[i]))) a = (json_decref(a), NULL);
    return a;
}

static json_t *body_json(const body_info *info, const void *body, errbuf *err);

static json_t *field_json(const field *f, const void *body, errbuf *err) {
    const char *at = (const char *)body + f->off;
    switch (f->kind) {
    case F_INT: return json_integer(*(const int *)at);
    case F_I64: return json_integer(*(const int64_t *)at);
    case F_F64: return json_real(*(const double *)at); /* NULL for a non-finite value */
    case F_BOOL: return json_boolean(*(const bool *)at);
    case F_STR: return json_string(at);
    case F_JSON: return json_incref(*(json_t *const *)at);
    case F_SUB: return body_json(f->sub, at, err);
    case F_JOB: return job_to_object((const job_config *)at, err);
    case F_MODEL: return llama_config_to_json((const llama_config *)at);
    case F_ADDRS: return addrs_json((const msg_peers *)at);
    case F_NODES: return nodes_json((const msg_nodes *)at);
    }
    return NULL;
}

static bool present(const field *f, const void *body) {
    if (f->kind == F_JSON) return *(json_t *const *)((const char *)body + f->off) != NULL;
    return !f->optional || *(const bool *)((const char *)body + f->has);
}

static json_t *body_json(const body_info *info, const void *body, errbuf *err) {
    json_t *o = json_object();
    if (!o) return errf(err, "out of memory"), NULL;
    for (int i = 0; i < info->n; i++) {
        const field *f = &info->fields[i];
        if (!present(f, body)) continue;
        json_t *v = field_json(f, body, err);
        if (!v) {
            if (f->kind != F_JOB && f->kind != F_SUB)
                errf(err, "field '%s': cannot encode it (out of memory, or not a finite number)", f->name);
            json_decref(o);
            return NULL;
        }
        if (json_object_set_new(o, f->name, v)) {
            json_decref(o);
            return errf(err, "out of memory"), NULL;
        }
    }
    return o;
}

json_t *msg_to_json(const msg *m, errbuf *err) {
    if (m->type <= 0 || m->type >= MSG_TYPE_END || bodies[m->type].n < 0)
        return errf(err, "%s: no JSON body", msg_type_name(m->type)), NULL;
    json_t *o = body_json(&bodies[m->type], &m->u, err);
    if (!o) errprefix(err, "%s", msg_type_name(m->type));
    return o;
}

/* The body's bytes: NCCL_ID's id in place, else JSON text in *owned (free it). */
static int body_bytes(const msg *m, char **owned, const void **body, size_t *len, errbuf *err) {
    *owned = NULL;
    if (m->type == MSG_NCCL_ID) {
        *body = m->u.nccl_id.id;
        *len = MSG_NCCL_ID_BYTES;
        return 0;
    }
    json_t *o = msg_to_json(m, err);
    if (!o) return -1;
    *owned = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!*owned) return errf(err, "%s: out of memory", msg_type_name(m->type));
    *body = *owned;
    *len = strlen(*owned);
    return 0;
}

int msg_encode(const msg *m, uint8_t **out, size_t *len, errbuf *err) {
    char *owned;
    const void *body;
    size_t n;
    if (body_bytes(m, &owned, &body, &n, err)) return -1;
    int rc = msg_frame_encode(m->type, body, n, out, len, err);
    free(owned);
    return rc;
}

/* ---- decoding ---- */

static int body_from_json(const body_info *info, void *body, const json_t *o, const char *type,
                          const char *prefix, errbuf *err);

static int field_error(const char *type, const char *prefix, const field *f, const char *want,
                       const json_t *v, errbuf *err) {
    return errf(err, "%s: field '%s%s' must be %s, got %s", type, prefix, f->name, want, json_kind(v));
}

static int read_integer(const field *f, const json_t *v, long long *out, const char *type,
                        const char *prefix, errbuf *err) {
    if (!json_is_integer(v)) return field_error(type, prefix, f, "an integer", v, err);
    long long x = (long long)json_integer_value(v);
    if (x < f->lo || x > f->hi)
        return errf(err, "%s: field '%s%s' = %lld is out of range [%lld, %lld]", type, prefix,
                    f->name, x, f->lo, f->hi);
    *out = x;
    return 0;
}

static int read_addrs(msg_peers *p, const json_t *v, const char *type, errbuf *err) {
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > INT_MAX / 2)
        return errf(err, "%s: field 'addrs' must be a non-empty array of strings", type);
    size_t n = json_array_size(v);
    p->addrs = calloc(n, sizeof *p->addrs);
    if (!p->addrs) return errf(err, "%s: out of memory", type);
    p->n = (int)n;
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(v, i));
        if (!s || strlen(s) >= MSG_ADDR_MAX)
            return errf(err, "%s: addrs[%zu] must be a string shorter than %d bytes", type, i, MSG_ADDR_MAX);
        strcpy(p->addrs[i], s);
    }
    return 0;
}

/* 1 to MSG_NODES_MAX distinct node indices >= 0. */
static int read_nodes(msg_nodes *p, const field *f, const json_t *v, const char *type, errbuf *err) {
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0 || n > MSG_NODES_MAX)
        return errf(err, "%s: field '%s' must be an array of 1 to %d node indices", type, f->name, MSG_NODES_MAX);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT_MAX)
            return errf(err, "%s: %s[%zu] is not a node index (an integer >= 0)", type, f->name, i);
        p->id[i] = (int)json_integer_value(x);
        for (size_t k = 0; k < i; k++)
            if (p->id[k] == p->id[i]) return errf(err, "%s: %s lists node %d twice", type, f->name, p->id[i]);
    }
    p->n = (int)n;
    return 0;
}

static int field_from_json(const field *f, void *body, const json_t *v, const char *type,
                           const char *prefix, errbuf *err) {
    char *at = (char *)body + f->off;
    long long x;
    switch (f->kind) {
    case F_INT:
        if (read_integer(f, v, &x, type, prefix, err)) return -1;
        *(int *)at = (int)x;
        return 0;
    case F_I64:
        if (read_integer(f, v, &x, type, prefix, err)) return -1;
        *(int64_t *)at = x;
        return 0;
    case F_F64:
        if (!json_is_number(v)) return field_error(type, prefix, f, "a number", v, err);
        *(double *)at = json_number_value(v);
        return 0;
    case F_BOOL:
        if (!json_is_boolean(v)) return field_error(type, prefix, f, "true or false", v, err);
        *(bool *)at = json_is_true(v);
        return 0;
    case F_STR: {
        const char *s = json_string_value(v);
        if (!s) return field_error(type, prefix, f, "a string", v, err);
        if (strlen(s) >= f->size || strlen(s) != json_string_length(v))
            return errf(err, "%s: field '%s%s' must be a string of fewer than %zu bytes, without NUL",
                        type, prefix, f->name, f->size);
        strcpy(at, s);
        return 0;
    }
    case F_JSON:
        if (!json_is_array(v) && !json_is_object(v)) return field_error(type, prefix, f, "an array or object", v, err);
        *(json_t **)at = json_incref((json_t *)v);
        return 0;
    case F_SUB: {
        char sub_prefix[64];
        snprintf(sub_prefix, sizeof sub_prefix, "%s%s.", prefix, f->name);
        return body_from_json(f->sub, at, v, type, sub_prefix, err);
    }
    case F_JOB:
        return job_from_object((job_config *)at, v, err) ? errprefix(err, "%s: field 'job'", type) : 0;
    case F_MODEL:
        return llama_config_from_json((llama_config *)at, v, "field 'model'", err) ? errprefix(err, "%s", type) : 0;
    case F_ADDRS:
        return read_addrs((msg_peers *)at, v, type, err);
    case F_NODES:
        return read_nodes((msg_nodes *)at, f, v, type, err);
    }
    return errf(err, "%s: field '%s%s' has no decoder", type, prefix, f->name);
}

static const field *find_field(const body_info *info, const char *name) {
    for (int i = 0; i < info->n; i++)
        if (!strcmp(info->fields[i].name, name)) return &info->fields[i];
    return NULL;
}

static int body_from_json(const body_info *info, void *body, const json_t *o, const char *type,
                          const char *prefix, errbuf *err) {
    if (!json_is_object(o)) return errf(err, "%s: %sbody must be a JSON object, got %s", type, prefix, json_kind(o));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (!find_field(info, key)) return errf(err, "%s: unknown field '%s%s'", type, prefix, key);
    }
    for (int i = 0; i < info->n; i++) {
        const field *f = &info->fields[i];
        v = json_object_get(o, f->name);
        if (!v) {
            if (!f->optional) return errf(err, "%s: field '%s%s' is missing", type, prefix, f->name);
            continue;
        }
        if (field_from_json(f, body, v, type, prefix, err)) return -1;
        if (f->optional && f->kind != F_JSON) *(bool *)((char *)body + f->has) = true;
    }
    return info->check ? info->check(body, type, err) : 0;
}

int msg_from_json(msg *m, msg_type type, const json_t *body, errbuf *err) {
    memset(m, 0, sizeof *m);
    if (type <= 0 || type >= MSG_TYPE_END || bodies[type].n < 0)
        return errf(err, "%s: no JSON body", msg_type_name(type));
    m->type = type;
    if (body_from_json(&bodies[type], &m->u, body, msg_type_name(type), "", err) == 0) return 0;
    msg_free(m);
    return -1;
}

int msg_decode(const msg_frame *f, msg *m, errbuf *err) {
    memset(m, 0, sizeof *m);
    if (f->type == MSG_NCCL_ID) {
        if (f->len != MSG_NCCL_ID_BYTES)
            return errf(err, "NCCL_ID: %u bytes, expected %d", f->len, MSG_NCCL_ID_BYTES);
        m->type = MSG_NCCL_ID;
        memcpy(m->u.nccl_id.id, f->body, MSG_NCCL_ID_BYTES);
        return 0;
    }
    json_error_t je;
    json_t *o = json_loadb(f->body, f->len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return errf(err, "%s: body is not JSON (line %d, column %d: %s)", msg_type_name(f->type),
                    je.line, je.column, je.text);
    int rc = msg_from_json(m, f->type, o, err);
    json_decref(o);
    return rc;
}

/* ---- blocking I/O ---- */

int msg_send(int fd, const msg *m, errbuf *err) {
    char *owned;
    const void *body;
    size_t n;
    if (body_bytes(m, &owned, &body, &n, err)) return -1;
    int rc = msg_send_frame(fd, m->type, body, n, err);
    free(owned);
    return rc;
}

int msg_recv(int fd, msg *m, int timeout_ms, errbuf *err) {
    msg_frame f;
    if (msg_recv_frame(fd, &f, timeout_ms, err)) return -1;
    int rc = msg_decode(&f, m, err);
    msg_frame_free(&f);
    return rc;
}
