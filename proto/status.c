/* status: the status socket's requests, replies and path.  See status.h. */
#include "proto/status.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/json_kind.h"

#define SOCKET_PREFIX "fsdpd-"
#define SOCKET_SUFFIX ".sock"

static const char *const cmd_names[] = {
    [STATUS_CMD_STATUS] = "status",
    [STATUS_CMD_CHECKPOINT] = "checkpoint",
    [STATUS_CMD_STOP] = "stop",
};
#define N_CMDS (sizeof cmd_names / sizeof cmd_names[0])

const char *status_cmd_name(status_cmd cmd) {
    return (size_t)cmd < N_CMDS ? cmd_names[cmd] : "unknown";
}

/* A client's text, made safe to quote in a message (and in fsdpd's log): at most 32
 * characters, anything but printable ASCII as '?'. */
static const char *quote_client_text(const char *s, char out[40]) {
    size_t i = 0;
    for (; s[i] && i < 32; i++) out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    if (s[i]) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

int status_request_parse(const char *line, size_t len, status_cmd *cmd, errbuf *err) {
    if (len > STATUS_LINE_MAX)
        return errf(err, "a request of %zu bytes is longer than the %d allowed", len, STATUS_LINE_MAX);
    if (len > 0 && line[len - 1] == '\n') len--;
    if (len > 0 && line[len - 1] == '\r') len--;
    if (len == 0) return errf(err, "empty request (send {\"cmd\": \"status\"})");
    if (memchr(line, '\0', len)) return errf(err, "the request holds a NUL byte");
    json_error_t je;
    json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!req) return errf(err, "the request is not JSON: %s (column %d)", je.text, je.column);
    int rc = 0;
    char quoted[40];
    if (!json_is_object(req)) {
        rc = errf(err, "the request is %s, not an object such as {\"cmd\": \"status\"}", json_kind(req));
    } else {
        const char *key;
        json_t *value;
        json_object_foreach(req, key, value) {
            if (strcmp(key, "cmd") != 0) {
                rc = errf(err, "unknown key '%s' (a request is {\"cmd\": \"status\"})",
                          quote_client_text(key, quoted));
                break;
            }
        }
    }
    const json_t *c = rc == 0 ? json_object_get(req, "cmd") : NULL;
    if (rc == 0 && !c) rc = errf(err, "the request has no \"cmd\"");
    if (rc == 0 && !json_is_string(c)) rc = errf(err, "\"cmd\" is %s, not a string", json_kind(c));
    if (rc == 0) {
        const char *name = json_string_value(c);
        size_t i = 0;
        while (i < N_CMDS && strcmp(name, cmd_names[i]) != 0) i++;
        if (i == N_CMDS)
            rc = errf(err, "unknown command '%s' (status, checkpoint or stop)", quote_client_text(name, quoted));
        else *cmd = (status_cmd)i;
    }
    json_decref(req);
    return rc;
}

int status_reply_parse(const char *line, size_t len, json_t **reply, errbuf *err) {
    json_error_t je;
    json_t *r = json_loadb(line, len, 0, &je);
    if (!r) return errf(err, "the reply is not JSON: %s (column %d)", je.text, je.column);
    const json_t *ok = json_object_get(r, "ok");
    int rc = 0;
    if (!json_is_object(r)) rc = errf(err, "the reply is %s, not an object", json_kind(r));
    else if (!json_is_boolean(ok)) rc = errf(err, "the reply has no \"ok\"");
    else if (json_is_false(ok)) {
        const char *why = json_string_value(json_object_get(r, "error"));
        rc = errf(err, "%s", why ? why : "the job refused the request without saying why");
    }
    if (rc) {
        json_decref(r);
        return rc;
    }
    *reply = r;
    return 0;
}

/* ---- the fields a reply must have for fsdpctl to print it ---- */

typedef enum reply_kind { R_STR, R_INT, R_NUM, R_BOOL, R_OBJ, R_ARR } reply_kind;

typedef struct reply_field {
    const char *key;
    reply_kind kind;
    int nullable, optional;
    const struct reply_field *sub; /* R_OBJ: its fields; R_ARR: each element's (an object) */
} reply_field;

#define END {NULL, 0, 0, 0, NULL}
static const reply_field job_fields[] = {{"id", R_STR, 0, 0, NULL}, {"node", R_INT, 0, 0, NULL},
                                         {"restart", R_INT, 0, 0, NULL}, {"pid", R_INT, 0, 0, NULL}, END};
static const reply_field step_fields[] = {{"step", R_INT, 0, 0, NULL}, END};
static const reply_field eval_fields[] = {{"loss", R_NUM, 0, 0, NULL}, {"step", R_INT, 0, 0, NULL}, END};
static const reply_field ckpt_fields[] = {{"dir", R_STR, 0, 0, NULL},
                                          {"last", R_OBJ, 1, 0, step_fields},
                                          {"in_flight", R_ARR, 0, 0, step_fields},
                                          {"failed_saves", R_INT, 0, 1, NULL},
                                          {"last_save_error", R_STR, 1, 1, NULL},
                                          END};
static const reply_field node_fields[] = {{"node", R_INT, 0, 0, NULL},         {"role", R_STR, 0, 0, NULL},
                                          {"host", R_STR, 0, 0, NULL},         {"connected", R_BOOL, 0, 0, NULL},
                                          {"state", R_STR, 0, 0, NULL},        {"last_heard_s", R_NUM, 1, 1, NULL},
                                          END};
static const reply_field rank_fields[] = {{"rank", R_INT, 0, 0, NULL},          {"node", R_INT, 0, 1, NULL},
                                          {"pid", R_INT, 0, 0, NULL},           {"running", R_BOOL, 0, 0, NULL},
                                          {"host_rss_bytes", R_INT, 1, 1, NULL}, {"gpu_bytes", R_INT, 1, 1, NULL},
                                          END};
static const reply_field straggler_fields[] = {{"rank", R_INT, 0, 0, NULL},   {"node", R_INT, 0, 0, NULL},
                                               {"phase", R_STR, 0, 0, NULL},  {"own_s", R_NUM, 0, 0, NULL},
                                               {"median_own_s", R_NUM, 0, 0, NULL}, {"comm_s", R_NUM, 0, 0, NULL},
                                               {"median_comm_s", R_NUM, 0, 0, NULL}, {"step_s", R_NUM, 0, 0, NULL},
                                               {"steps", R_INT, 0, 0, NULL},  END};
static const reply_field status_fields[] = {
    {"job", R_OBJ, 0, 0, job_fields},        {"state", R_STR, 0, 0, NULL},
    {"stop_requested", R_BOOL, 0, 0, NULL},  {"step", R_INT, 1, 0, NULL},
    {"total_steps", R_INT, 1, 0, NULL},      {"loss", R_NUM, 1, 0, NULL},
    {"lr", R_NUM, 1, 0, NULL},               {"grad_norm", R_NUM, 1, 0, NULL},
    {"tokens_per_s", R_NUM, 1, 1, NULL},     {"eta_s", R_NUM, 1, 1, NULL},
    {"eval", R_OBJ, 1, 1, eval_fields},      {"checkpoint", R_OBJ, 0, 0, ckpt_fields},
    {"nodes", R_ARR, 0, 1, node_fields},     {"ranks", R_ARR, 0, 0, rank_fields},
    {"backend", R_STR, 0, 0, NULL},          {"fabric", R_STR, 1, 0, NULL},
    {"restarts", R_INT, 0, 0, NULL},         {"last_error", R_STR, 1, 0, NULL},
    {"stragglers", R_ARR, 0, 1, straggler_fields},
    END};
/* "request" and "checkpoint_request" are null when a follower forwarded the request to the
 * leader (whose id it does not know), or when a stop needs no checkpoint */
static const reply_field request_fields[] = {{"message", R_STR, 0, 0, NULL}, {"request", R_INT, 1, 1, NULL},
                                             {"checkpoint_request", R_INT, 1, 1, NULL}, END};
#undef END

static int kind_is(reply_kind k, const json_t *v) {
    switch (k) {
    case R_STR: return json_is_string(v);
    case R_INT: return json_is_integer(v);
    case R_NUM: return json_is_number(v);
    case R_BOOL: return json_is_boolean(v);
    case R_OBJ: return json_is_object(v);
    case R_ARR: return json_is_array(v);
    }
    return 0;
}

static const char *const kind_names[] = {"a string", "an integer", "a number", "a boolean", "an object", "an array"};

static int check_fields(const reply_field *fields, const json_t *o, const char *at, errbuf *err);

static int check_value(const reply_field *f, const json_t *v, const char *name, errbuf *err) {
    if (!v) return f->optional ? 0 : errf(err, "the reply's field '%s' is missing", name);
    if (json_is_null(v) && f->nullable) return 0;
    if (!kind_is(f->kind, v))
        return errf(err, "the reply's field '%s' is %s, not %s", name, json_kind(v), kind_names[f->kind]);
    if (f->kind == R_OBJ) return check_fields(f->sub, v, name, err);
    size_t i;
    const json_t *e;
    if (f->kind == R_ARR) json_array_foreach(v, i, e) {
            char item[192];
            snprintf(item, sizeof item, "%s[%zu]", name, i);
            if (!json_is_object(e)) return errf(err, "the reply's field '%s' is %s, not an object", item, json_kind(e));
            if (check_fields(f->sub, e, item, err)) return -1;
        }
    return 0;
}

static int check_fields(const reply_field *fields, const json_t *o, const char *at, errbuf *err) {
    for (const reply_field *f = fields; f->key; f++) {
        char name[160];
        snprintf(name, sizeof name, "%s%s%s", at, *at ? "." : "", f->key);
        if (check_value(f, json_object_get(o, f->key), name, err)) return -1;
    }
    return 0;
}

int status_reply_check(status_cmd cmd, const json_t *reply, errbuf *err) {
    if (!json_is_object(reply)) return errf(err, "the reply is %s, not an object", json_kind(reply));
    return check_fields(cmd == STATUS_CMD_STATUS ? status_fields : request_fields, reply, "", err);
}

int status_job_id_valid(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n >= STATUS_JOB_ID_MAX || id[0] == '.' || id[0] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && !strchr("_.-", id[i])) return 0;
    return 1;
}

int status_socket_dir(char *out, size_t n, int under_slurm, const char *xdg_runtime_dir, const char *tmpdir,
                      unsigned uid, errbuf *err) {
    int len = !under_slurm && xdg_runtime_dir && *xdg_runtime_dir
                  ? snprintf(out, n, "%s", xdg_runtime_dir)
                  : snprintf(out, n, "%s/fsdpd-%u", tmpdir && *tmpdir ? tmpdir : "/tmp", uid);
    if (len < 0 || (size_t)len >= n) return errf(err, "the status socket directory '%.64s...' is too long", out);
    return 0;
}

int status_socket_path(char *out, size_t n, const char *dir, const char *job_id, int restart,
                       int node, errbuf *err) {
    if (!status_job_id_valid(job_id))
        return errf(err, "job id '%s' cannot name a socket (letters, digits, '_', '.', '-')", job_id);
    if (restart < 0 || node < 0) return errf(err, "negative restart count or node index");
    int len = snprintf(out, n, "%s/" SOCKET_PREFIX "%s-r%d-n%d" SOCKET_SUFFIX, dir, job_id, restart, node);
    if (len < 0 || (size_t)len >= n || len >= STATUS_SOCKET_MAX) {
        if (n) out[0] = '\0';
        return errf(err, "%s: the status socket's path would be longer than the %d bytes a Unix socket "
                         "allows (set runtime.status_socket)", dir, STATUS_SOCKET_MAX - 1);
    }
    return 0;
}

/* A decimal count without sign or spaces, at most INT_MAX; -1 when it is not one. */
static int parse_count(const char *s, size_t len) {
    if (len == 0 || len > 9) return -1;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

int status_socket_name_parse(const char *name, char job_id[STATUS_JOB_ID_MAX], int *restart,
                             int *node) {
    size_t len = strlen(name), pre = strlen(SOCKET_PREFIX), suf = strlen(SOCKET_SUFFIX);
    if (len <= pre + suf || strncmp(name, SOCKET_PREFIX, pre) != 0 ||
        strcmp(name + len - suf, SOCKET_SUFFIX) != 0)
        return 0;
    /* JOBID-rR-nN: the job id may hold dashes, so read the numbers from the end. */
    const char *body = name + pre, *end = name + len - suf;
    const char *n_at = NULL, *r_at = NULL;
    for (const char *p = end - 1; p > body; p--)
        if (p[-1] == '-' && p[0] == 'n') {
            n_at = p;
            break;
        }
    for (const char *p = n_at ? n_at - 2 : body; p > body; p--)
        if (p[-1] == '-' && p[0] == 'r') {
            r_at = p;
            break;
        }
    if (!n_at || !r_at) return 0;
    size_t r_len = (size_t)(n_at - 1 - (r_at + 1)), n_len = (size_t)(end - (n_at + 1));
    int r = parse_count(r_at + 1, r_len), n = parse_count(n_at + 1, n_len);
    /* Only the names status_socket_path makes: no leading zeros. */
    if ((r_len > 1 && r_at[1] == '0') || (n_len > 1 && n_at[1] == '0')) return 0;
    size_t id_len = (size_t)(r_at - 1 - body);
    if (r < 0 || n < 0 || id_len == 0 || id_len >= STATUS_JOB_ID_MAX) return 0;
    char id[STATUS_JOB_ID_MAX];
    memcpy(id, body, id_len);
    id[id_len] = '\0';
    if (!status_job_id_valid(id)) return 0;
    memcpy(job_id, id, id_len + 1);
    *restart = r;
    *node = n;
    return 1;
}

int status_place_from_env(status_place *p, errbuf *err) {
    memset(p, 0, sizeof *p);
    const char *job = getenv("SLURM_JOB_ID"), *restart = getenv("SLURM_RESTART_COUNT");
    p->under_slurm = job && *job;
    if (p->under_slurm) {
        if (!status_job_id_valid(job)) return errf(err, "SLURM_JOB_ID '%.64s' is not a job id", job);
        snprintf(p->job_id, sizeof p->job_id, "%s", job);
    } else {
        snprintf(p->job_id, sizeof p->job_id, "local-%ld", (long)getpid());
    }
    if (restart && *restart && (p->restart = parse_count(restart, strlen(restart))) < 0)
        return errf(err, "SLURM_RESTART_COUNT '%.64s' is not a count", restart);
    return status_socket_dir(p->dir, sizeof p->dir, p->under_slurm, getenv("XDG_RUNTIME_DIR"), getenv("TMPDIR"),
                             (unsigned)geteuid(), err);
}

int status_output_record_path(char *out, size_t n, const char *dir, const char *job_id, errbuf *err) {
    if (!status_job_id_valid(job_id)) return errf(err, "'%.64s' is not a job id", job_id);
    int len = snprintf(out, n, "%s/fsdpd-%s.output", dir, job_id);
    return len < 0 || (size_t)len >= n ? errf(err, "%s: the directory's path is too long", dir) : 0;
}

int status_output_record_parse(const char *text, size_t len, char *out, size_t n, const char *name, errbuf *err) {
    if (len > STATUS_OUTPUT_RECORD_MAX) return errf(err, "%s: %zu bytes, more than the record holds", name, len);
    if (len < 2 || text[len - 1] != '\n') return errf(err, "%s: not one line ending in a newline", name);
    size_t dir = len - 1;
    if (memchr(text, '\n', dir) || memchr(text, '\0', dir))
        return errf(err, "%s: more than one line, or a NUL byte", name);
    if (text[0] != '/') return errf(err, "%s: '%.*s' is not an absolute path", name, (int)(dir < 200 ? dir : 200), text);
    if (dir >= n) return errf(err, "%s: the path is longer than %zu bytes", name, n - 1);
    memcpy(out, text, dir);
    out[dir] = '\0';
    return 0;
}
