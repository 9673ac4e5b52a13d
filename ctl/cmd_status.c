/* fsdpctl status|checkpoint|stop: the client of a running job's status socket
 * (proto/status.h).  The socket is --socket PATH, or the one of job --job-id ID (or of
 * SLURM_JOB_ID) in the default directory (the newest restart, the lowest node index), or,
 * with neither, the only job answering in that directory.  Exit status: 0 when the job
 * answered "ok", 1 when no job answers or it refused, 2 for bad usage. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "ctl/fsdpctl.h"
#include "proto/run_record.h"
#include "proto/status.h"

#define REPLY_MAX (1u << 20)
#define DEFAULT_TIMEOUT_S 10

typedef struct client_options {
    status_cmd cmd;
    const char *socket;
    const char *job_id;
    const char *output; /* status of a job that may have ended: its run.json */
    int json;
    int timeout_s;
} client_options;

static void usage(FILE *f, const char *name) {
    int status = !strcmp(name, "status");
    fprintf(f, "usage: fsdpctl %s [--socket PATH | --job-id ID%s] [--json] [--timeout S]\n"
               "  --socket PATH  the job's status socket (fsdpd logs it when it starts)\n"
               "  --job-id ID    the job's socket in the default directory (SLURM_JOB_ID when set)%s\n"
               "%s"
               "  --json         print the job's reply as it came (one JSON line)\n"
               "  --timeout S    seconds to wait for the reply (default %d)\n",
            name, status ? " | --output DIR" : "",
            status ? ";\n                 once the job has ended, its summary (OUTPUT_DIR/run.json)" : "",
            status ? "  --output DIR   the job of output.dir DIR from its run.json (running or ended)\n" : "",
            DEFAULT_TIMEOUT_S);
}

/* Returns 0 to go on, or -1 to stop with *status (0 after --help, 2 for bad usage). */
static int parse_options(int argc, char **argv, client_options *o, int *status) {
    static const struct option longopts[] = {
        {"socket", required_argument, 0, 's'}, {"job-id", required_argument, 0, 'j'},
        {"json", no_argument, 0, 'J'},         {"timeout", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},         {"output", required_argument, 0, 'o'},
        {0, 0, 0, 0}};
    const char *name = status_cmd_name(o->cmd);
    int opt;
    char *end;
    optind = 1;
    opterr = 0;
    *status = 2;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 's': o->socket = optarg; break;
        case 'j': o->job_id = optarg; break;
        case 'J': o->json = 1; break;
        case 'o':
            if (o->cmd != STATUS_CMD_STATUS) {
                fprintf(stderr, "fsdpctl %s: --output is for fsdpctl status only\n", name);
                return -1;
            }
            o->output = optarg;
            break;
        case 't':
            o->timeout_s = (int)strtol(optarg, &end, 10);
            if (!*optarg || *end || o->timeout_s < 1 || o->timeout_s > 3600) {
                fprintf(stderr, "fsdpctl %s: --timeout '%s' is not a number of seconds (1 to 3600)\n", name,
                        optarg);
                return -1;
            }
            break;
        case 'h':
            usage(stdout, name);
            *status = 0;
            return -1;
        default:
            /* the flag itself, not only the usage: "--sockt" or "--socket" without its value */
            ctl_flag_error(name, argv);
            usage(stderr, name);
            return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "fsdpctl %s: unexpected argument '%s'\n", name, argv[optind]);
        usage(stderr, name);
        return -1;
    }
    if (!!o->socket + !!o->job_id + !!o->output > 1) {
        fprintf(stderr, "fsdpctl %s: give one of --socket, --job-id and --output\n", name);
        usage(stderr, name);
        return -1;
    }
    if (o->job_id && !status_job_id_valid(o->job_id)) {
        fprintf(stderr, "fsdpctl %s: --job-id '%s' is not a job id\n", name, o->job_id);
        return -1;
    }
    return 0;
}

/* ---- talking to the socket ---- */

/* A connected socket, or -1 with why no job answers at path.  Only a socket of this user (or
 * root) is asked: another user's, at a job's name, would answer whatever it likes. */
static int connect_to(const char *path, errbuf *err) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path)
        return errf(err, "%s: longer than a Unix socket path can be (%zu bytes)", path, sizeof a.sun_path - 1);
    struct stat st;
    int exists = lstat(path, &st) == 0; /* a missing one: connect says so */
    if (exists && !S_ISSOCK(st.st_mode))
        return errf(err, "%s: is %s, not a job's status socket", path, file_type_name(st.st_mode));
    if (exists && st.st_uid != geteuid() && st.st_uid != 0)
        return errf(err, "%s: the socket belongs to uid %u, not to you (uid %u) or root: not your job's, not asked",
                    path, (unsigned)st.st_uid, (unsigned)geteuid());
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errf(err, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
    int e = errno;
    close(fd);
    if (e == ENOENT) return errf(err, "no job answers at %s: there is no such socket", path);
    if (e == ECONNREFUSED)
        return errf(err, "no job answers at %s: connection refused (its daemon has exited)", path);
    if (e == EAGAIN) return errf(err, "%s: the job's connection queue is full; try again", path);
    if (e == EACCES) return errf(err, "%s: permission denied (the socket belongs to another user)", path);
    return errf(err, "%s: cannot connect: %s", path, strerror(e));
}

/* Waits for fd to be ready for `events` until the deadline. */
static int wait_fd(int fd, short events, double deadline, const char *path, errbuf *err) {
    for (;;) {
        double left = deadline - clock_now_s();
        if (left <= 0) return errf(err, "no reply from %s in time: the job is not answering", path);
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return errf(err, "poll: %s", strerror(errno));
    }
}

/* Sends one request and reads the reply line into *reply (malloc'd, without its '\n'). */
static int exchange(int fd, const char *path, status_cmd cmd, int timeout_s, char **reply, errbuf *err) {
    double deadline = clock_now_s() + timeout_s;
    char request[64];
    int len = snprintf(request, sizeof request, "{\"cmd\":\"%s\"}\n", status_cmd_name(cmd));
    for (int sent = 0; sent < len;) {
        if (wait_fd(fd, POLLOUT, deadline, path, err)) return -1;
        ssize_t n = send(fd, request + sent, (size_t)(len - sent), MSG_NOSIGNAL);
        /* A job that refuses this client replies and closes at once: read its reply. */
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) break;
        if (n < 0 && errno != EAGAIN && errno != EINTR) return errf(err, "%s: send: %s", path, strerror(errno));
        if (n > 0) sent += (int)n;
    }
    size_t cap = 4096, have = 0;
    char *buf = malloc(cap);
    if (!buf) return errf(err, "out of memory");
    for (;;) {
        if (wait_fd(fd, POLLIN, deadline, path, err)) break;
        if (have + 1 == cap) {
            char *bigger = cap < REPLY_MAX ? realloc(buf, cap * 2) : NULL;
            if (!bigger) {
                errf(err, "%s: the reply is longer than %u bytes", path, REPLY_MAX);
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        ssize_t n = recv(fd, buf + have, cap - 1 - have, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n < 0) {
            errf(err, "%s: %s", path, strerror(errno));
            break;
        }
        if (n == 0) {
            errf(err, "%s: the job closed the connection without replying", path);
            break;
        }
        char *nl = memchr(buf + have, '\n', (size_t)n);
        have += (size_t)n;
        if (nl) {
            *nl = '\0';
            *reply = buf;
            return 0;
        }
    }
    free(buf);
    return -1;
}

/* ---- finding the socket ---- */

typedef struct candidate {
    char path[STATUS_SOCKET_MAX];
    char job_id[STATUS_JOB_ID_MAX];
    int restart, node;
} candidate;

/* The sockets in dir (of job_id, or of every job when NULL), in *out (malloc'd). */
static int list_sockets(const char *dir, const char *job_id, candidate **out, int *n, errbuf *err) {
    DIR *d = opendir(dir);
    if (!d) return errf(err, "%s: %s", dir, strerror(errno));
    candidate *list = NULL;
    int count = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        candidate c;
        if (!status_socket_name_parse(e->d_name, c.job_id, &c.restart, &c.node)) continue;
        if (job_id && strcmp(job_id, c.job_id) != 0) continue;
        if (snprintf(c.path, sizeof c.path, "%s/%s", dir, e->d_name) >= (int)sizeof c.path) continue;
        candidate *bigger = realloc(list, (size_t)(count + 1) * sizeof *list);
        if (!bigger) {
            rc = errf(err, "out of memory");
            break;
        }
        list = bigger;
        list[count++] = c;
    }
    closedir(d);
    if (rc) {
        free(list);
        return -1;
    }
    *out = list;
    *n = count;
    return 0;
}

/* The socket of job_id: the newest restart's, the lowest node's. */
static int find_job_socket(const char *dir, const char *job_id, char *path, errbuf *err) {
    candidate *list;
    int n;
    if (list_sockets(dir, job_id, &list, &n, err)) return -1;
    int best = -1;
    for (int i = 0; i < n; i++)
        if (best < 0 || list[i].restart > list[best].restart ||
            (list[i].restart == list[best].restart && list[i].node < list[best].node))
            best = i;
    if (best >= 0) memcpy(path, list[best].path, sizeof list[best].path);
    free(list);
    if (best < 0)
        return errf(err, "no job answers: no status socket of job %s in %s (not running on this node? "
                         "give --socket PATH)", job_id, dir);
    return 0;
}

/* With no job named: the only job whose socket answers in dir (dead daemons' sockets are
 * skipped). */
static int find_only_job(const char *dir, char *path, errbuf *err) {
    candidate *list;
    int n, live = 0;
    char names[512] = "";
    if (list_sockets(dir, NULL, &list, &n, err)) return -1;
    for (int i = 0; i < n; i++) {
        errbuf ignored;
        int fd = connect_to(list[i].path, &ignored);
        if (fd < 0) continue;
        close(fd);
        if (live++ == 0) memcpy(path, list[i].path, sizeof list[i].path);
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "", list[i].job_id);
    }
    free(list);
    if (live == 0) return errf(err, "no job answers: no live status socket in %s (give --socket PATH or --job-id ID)", dir);
    if (live > 1) return errf(err, "%d jobs answer in %s (%s): pick one with --job-id ID", live, dir, names);
    return 0;
}

static int resolve_socket(const client_options *o, char *path, errbuf *err) {
    if (o->socket) {
        if (snprintf(path, STATUS_SOCKET_MAX, "%s", o->socket) >= STATUS_SOCKET_MAX)
            return errf(err, "%s: longer than a Unix socket path can be", o->socket);
        return 0;
    }
    const char *slurm_job = getenv("SLURM_JOB_ID");
    int under_slurm = slurm_job && *slurm_job;
    char dir[JOB_PATH_MAX];
    if (status_socket_dir(dir, sizeof dir, under_slurm, getenv("XDG_RUNTIME_DIR"), getenv("TMPDIR"),
                          (unsigned)geteuid(), err) ||
        file_private_dir(dir, 0, err))
        return -1;
    const char *job_id = o->job_id ? o->job_id : under_slurm ? slurm_job : NULL;
    if (job_id) return find_job_socket(dir, job_id, path, err);
    return find_only_job(dir, path, err);
}

/* ---- printing a reply ---- */

static const json_t *get(const json_t *o, const char *key) {
    return json_object_get(o, key);
}

static void print_duration(double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) printf("%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) printf("%ldm%02lds", t / 60, t % 60);
    else printf("%lds", t);
}

static void print_bytes(const json_t *v) {
    if (!json_is_integer(v)) printf("-");
    else printf("%.1f MB", (double)json_integer_value(v) / 1e6);
}

static void print_status(const json_t *r) {
    const json_t *job = get(r, "job");
    printf("job %s (node %lld, restart %lld, fsdpd pid %lld): %s%s\n", json_string_value(get(job, "id")),
           json_integer_value(get(job, "node")), json_integer_value(get(job, "restart")),
           json_integer_value(get(job, "pid")), json_string_value(get(r, "state")),
           json_is_true(get(r, "stop_requested")) ? " (stopping after a checkpoint)" : "");
    if (json_is_integer(get(r, "step"))) {
        long long step = json_integer_value(get(r, "step")), total = json_integer_value(get(r, "total_steps"));
        printf("step %lld/%lld (%.1f%%)  loss %.4f  lr %.3e  grad_norm %.3f", step, total,
               total > 0 ? 100.0 * (double)step / (double)total : 0.0, json_number_value(get(r, "loss")),
               json_number_value(get(r, "lr")), json_number_value(get(r, "grad_norm")));
        if (json_is_number(get(r, "tokens_per_s"))) printf("  %.0f tokens/s", json_number_value(get(r, "tokens_per_s")));
        if (json_is_number(get(r, "eta_s"))) {
            printf("  ETA ");
            print_duration(json_number_value(get(r, "eta_s")));
        }
        printf("\n");
    } else {
        printf("no step finished yet\n");
    }
    const json_t *eval = get(r, "eval");
    if (json_is_object(eval))
        printf("eval loss %.4f after step %lld\n", json_number_value(get(eval, "loss")),
               json_integer_value(get(eval, "step")));
    const json_t *ck = get(r, "checkpoint"), *last = get(ck, "last"), *flight = get(ck, "in_flight");
    printf("checkpoints in %s: ", json_string_value(get(ck, "dir")));
    if (json_is_object(last)) printf("last step %lld", json_integer_value(get(last, "step")));
    else printf("none committed yet");
    size_t i;
    const json_t *v;
    json_array_foreach(flight, i, v) printf("%s step %lld", i ? "," : "; being written:", json_integer_value(get(v, "step")));
    printf("\n");
    if (json_integer_value(get(ck, "failed_saves")) > 0 || json_is_string(get(ck, "last_save_error")))
        printf("failed saves in a row: %lld; the last save error: %s\n", json_integer_value(get(ck, "failed_saves")),
               json_is_string(get(ck, "last_save_error")) ? json_string_value(get(ck, "last_save_error")) : "none");
    json_array_foreach(get(r, "nodes"), i, v) {
        const json_t *heard = get(v, "last_heard_s");
        printf("node %lld  %s  %s  %s", json_integer_value(get(v, "node")), json_string_value(get(v, "role")),
               json_string_value(get(v, "host")), json_is_true(get(v, "connected")) ? json_string_value(get(v, "state"))
                                                                                  : "disconnected");
        if (json_is_number(heard)) printf("  heard %.1f s ago", json_number_value(heard));
        printf("\n");
    }
    json_array_foreach(get(r, "ranks"), i, v) {
        printf("  rank %lld", json_integer_value(get(v, "rank")));
        if (json_array_size(get(r, "nodes")) > 0) printf("  node %lld", json_integer_value(get(v, "node")));
        printf("  pid %lld  %s  host ", json_integer_value(get(v, "pid")),
               json_is_true(get(v, "running")) ? "running" : "exited ");
        print_bytes(get(v, "host_rss_bytes"));
        printf("  gpu ");
        print_bytes(get(v, "gpu_bytes"));
        const json_t *progress = get(v, "progress");
        if (json_is_object(progress))
            printf("  step %lld, progress %.1f s ago", json_integer_value(get(progress, "step")),
                   json_number_value(get(progress, "still_s")));
        printf("\n");
    }
    json_array_foreach(get(r, "stragglers"), i, v) {
        printf("straggler: rank %lld on node %lld, phase %s: %.3f s a step of its own against the ranks' median %.3f s "
               "(in collectives %.3f s, median %.3f s), %.3f s a step, for %lld steps\n",
               json_integer_value(get(v, "rank")), json_integer_value(get(v, "node")), json_string_value(get(v, "phase")),
               json_number_value(get(v, "own_s")), json_number_value(get(v, "median_own_s")),
               json_number_value(get(v, "comm_s")), json_number_value(get(v, "median_comm_s")),
               json_number_value(get(v, "step_s")), json_integer_value(get(v, "steps")));
    }
    const char *fabric = json_string_value(get(r, "fabric"));
    printf("backend %s, fabric %s, restarts %lld\n", json_string_value(get(r, "backend")), fabric ? fabric : "-",
           json_integer_value(get(r, "restarts")));
    const char *error = json_string_value(get(r, "last_error"));
    printf("last error: %s\n", error ? error : "none");
}

static void print_reply(status_cmd cmd, const json_t *r) {
    if (cmd == STATUS_CMD_STATUS) {
        print_status(r);
        return;
    }
    const json_t *id = get(r, cmd == STATUS_CMD_CHECKPOINT ? "request" : "checkpoint_request");
    if (json_is_integer(id)) printf("%s (checkpoint request %lld)\n", json_string_value(get(r, "message")), json_integer_value(id));
    else printf("%s\n", json_string_value(get(r, "message")));
}

/* ---- a job from its run.json (ended, or running without a socket here) ---- */

static void print_record(const run_record *r) {
    printf("job %s%s (output %s): %s\n", r->job_id[0] ? "" : "started ", r->job_id[0] ? r->job_id : "", r->output_dir,
           r->has_summary ? "finished" : "no summary: running, or it ended without finishing");
    time_t t = (time_t)r->started;
    struct tm tm;
    char when[64] = "?";
    if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    printf("started %s by fsdpd %s, %s backend, %lld node%s x %lld worker%s, train.type %s\n", when, r->fsdpd_version,
           r->backend, (long long)r->nodes, r->nodes == 1 ? "" : "s", (long long)r->workers_per_node,
           r->workers_per_node == 1 ? "" : "s", r->train_type);
    if (!r->has_summary) return;
    const run_summary *s = &r->summary;
    printf("steps %lld, tokens %lld, wall ", (long long)s->steps, (long long)s->tokens);
    print_duration(s->wall_s);
    printf(", %.0f tokens/s", s->tokens_per_s);
    if (s->has_mfu) printf(", MFU %.1f%%", 100 * s->mfu);
    printf("\nfinal loss %.4f", s->final_loss);
    if (s->has_eval) printf(", eval loss %.4f (best %.4f after step %lld)", s->final_eval_loss, s->best_eval_loss,
                            (long long)s->best_eval_step);
    printf("\ncheckpoints in %s:", r->checkpoint_dir);
    for (int i = 0; i < s->n_checkpoints; i++) printf("%s %s", i ? "," : "", s->checkpoints[i]);
    printf("%s\nload: %s\n", s->n_checkpoints ? "" : " none", s->load);
}

static int status_from_record(const char *output_dir, int json) {
    static run_record r;
    errbuf err;
    if (run_record_load(&r, output_dir, &err)) {
        fprintf(stderr, "fsdpctl status: %s\n", err.msg);
        return 1;
    }
    if (json) {
        char *text;
        if (run_record_to_json(&r, &text, &err)) return fprintf(stderr, "fsdpctl status: %s\n", err.msg), 1;
        printf("%s\n", text);
        free(text);
    } else {
        print_record(&r);
    }
    return 0;
}

/* --job-id ID whose socket does not answer: the output directory its leader recorded. */
static int record_of_job(const char *job_id, char *out, size_t n, errbuf *err) {
    const char *slurm_job = getenv("SLURM_JOB_ID");
    char dir[JOB_PATH_MAX], path[PATH_BYTES];
    if (status_socket_dir(dir, sizeof dir, slurm_job && *slurm_job, getenv("XDG_RUNTIME_DIR"), getenv("TMPDIR"),
                          (unsigned)geteuid(), err) ||
        status_output_record_path(path, sizeof path, dir, job_id, err))
        return -1;
    char *text;
    size_t len;
    if (file_read_private(path, STATUS_OUTPUT_RECORD_MAX, &text, &len, err)) return -1;
    int rc = status_output_record_parse(text, len, out, n, path, err);
    free(text);
    return rc;
}

static int run(status_cmd cmd, int argc, char **argv) {
    client_options o = {.cmd = cmd, .timeout_s = DEFAULT_TIMEOUT_S};
    const char *name = status_cmd_name(cmd);
    int status;
    if (parse_options(argc, argv, &o, &status)) return status;
    if (o.output) return status_from_record(o.output, o.json);
    char path[STATUS_SOCKET_MAX], *line = NULL;
    errbuf err;
    int fd = resolve_socket(&o, path, &err) == 0 ? connect_to(path, &err) : -1;
    int rc = fd < 0 ? -1 : exchange(fd, path, cmd, o.timeout_s, &line, &err);
    if (fd >= 0) close(fd);
    char output_dir[PATH_BYTES];
    errbuf why;
    const char *job_id = o.job_id ? o.job_id : o.socket ? NULL : getenv("SLURM_JOB_ID");
    if (rc && fd < 0 && cmd == STATUS_CMD_STATUS && job_id && *job_id && status_job_id_valid(job_id) &&
        record_of_job(job_id, output_dir, sizeof output_dir, &why) == 0)
        return status_from_record(output_dir, o.json);
    if (rc) {
        fprintf(stderr, "fsdpctl %s: %s\n", name, err.msg);
        return 1;
    }
    json_t *reply = NULL;
    rc = status_reply_parse(line, strlen(line), &reply, &err);
    if (rc == 0 && !o.json && status_reply_check(cmd, reply, &err)) {
        fprintf(stderr, "fsdpctl %s: %s answered something fsdpd does not send: %s\n", name, path, err.msg);
        json_decref(reply);
        free(line);
        return 1;
    }
    if (o.json) printf("%s\n", line);
    else if (rc == 0) print_reply(cmd, reply);
    if (rc) fprintf(stderr, "fsdpctl %s: the job at %s refused: %s\n", name, path, err.msg);
    json_decref(reply);
    free(line);
    return rc ? 1 : 0;
}

int cmd_status(int argc, char **argv) {
    return run(STATUS_CMD_STATUS, argc, argv);
}

int cmd_checkpoint(int argc, char **argv) {
    return run(STATUS_CMD_CHECKPOINT, argc, argv);
}

int cmd_stop(int argc, char **argv) {
    return run(STATUS_CMD_STOP, argc, argv);
}
