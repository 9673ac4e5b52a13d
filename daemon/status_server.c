/* status_server: the status socket on fsdpd's event loop.  See status_server.h. */
#include "base/fileio.h"
#include "base/path.h"
#include "daemon/status_server.h"

#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/host_memory.h"
#include "daemon/log.h"
#include "proto/ckpt.h"

#define OUTPUT_MAX (256u << 10) /* replies queued for a client that does not read them */
#define LISTEN_BACKLOG 64

typedef struct client client;

struct status_server {
    status_server_options opt;
    char path[STATUS_SOCKET_MAX];
    dev_t dev;                  /* the socket file this server made */
    ino_t ino;
    struct evconnlistener *listener;
    struct event *resume_accept; /* after an accept error (out of descriptors) */
    client *clients;
    int n_clients;
    struct job_binding *job;    /* status_server_open's, else NULL */
};

struct client {
    status_server *server;
    client *prev, *next;
    struct bufferevent *bev;
    struct event *deadline;
    int closing; /* the last reply is queued: close once it is written */
};

/* fsdpd's log gets client text only as printable ASCII. */
static const char *printable(const char *s, char *out, size_t n) {
    size_t i = 0;
    for (; s[i] && i + 1 < n; i++) out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[i] = '\0';
    return out;
}

/* ---- one client ---- */

static void free_client(client *c) {
    status_server *s = c->server;
    if (c->prev) c->prev->next = c->next;
    else s->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_clients--;
    if (c->deadline) event_free(c->deadline);
    bufferevent_free(c->bev);
    free(c);
}

static void arm_deadline(client *c) {
    int ms = c->server->opt.timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->deadline, &tv);
}

static void send_reply(client *c, json_t *reply) {
    char *text = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    json_decref(reply);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (!text) {
        evbuffer_add_printf(out, "{\"ok\":false,\"error\":\"fsdpd: out of memory\"}\n");
        return;
    }
    evbuffer_add(out, text, strlen(text));
    evbuffer_add(out, "\n", 1);
    free(text);
}

static void send_error(client *c, const char *msg) {
    send_reply(c, json_pack("{s:b, s:s}", "ok", 0, "error", msg));
}

/* The last reply: nothing more is read, and the connection closes once it is written (or
 * when the deadline passes first: a client that does not read). */
static void send_final_error(client *c, const char *msg) {
    send_error(c, msg);
    c->closing = 1;
    bufferevent_disable(c->bev, EV_READ);
    arm_deadline(c);
}

static void answer(client *c, const char *line, size_t len) {
    status_server *s = c->server;
    status_cmd cmd;
    errbuf err;
    char shown[256];
    if (status_request_parse(line, len, &cmd, &err)) {
        log_event(-1, "status socket: bad request: %s", printable(err.msg, shown, sizeof shown));
        send_error(c, err.msg);
        return;
    }
    json_t *members = s->opt.handle(s->opt.arg, cmd, &err);
    if (!members) {
        send_error(c, err.msg);
        return;
    }
    json_t *reply = json_pack("{s:b, s:s}", "ok", 1, "cmd", status_cmd_name(cmd));
    if (reply && json_object_update(reply, members) != 0) reply = (json_decref(reply), NULL);
    json_decref(members);
    send_reply(c, reply);
}

/* Answers every complete line in the input; with `throttle`, stops while replies pile up
 * unread (on_written goes on once they are written). */
static void answer_lines(client *c, int throttle) {
    struct evbuffer *in = bufferevent_get_input(c->bev), *out = bufferevent_get_output(c->bev);
    while (!c->closing && (!throttle || evbuffer_get_length(out) < OUTPUT_MAX)) {
        size_t len;
        char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_LF);
        if (!line) {
            /* No '\n' in STATUS_LINE_MAX bytes: the line would be longer than allowed.
             * (Reading stops at that much: see the read watermark.) */
            if (evbuffer_get_length(in) >= STATUS_LINE_MAX) {
                char msg[128];
                snprintf(msg, sizeof msg, "a request line is at most %d bytes: closing the connection",
                         STATUS_LINE_MAX);
                log_event(-1, "status socket: %s", msg);
                send_final_error(c, msg);
            }
            return;
        }
        answer(c, line, len);
        arm_deadline(c);
        free(line);
    }
}

static void on_readable(struct bufferevent *bev, void *arg) {
    (void)bev;
    answer_lines(arg, 1);
}

static void on_written(struct bufferevent *bev, void *arg) {
    client *c = arg;
    if (c->closing) {
        free_client(c);
        return;
    }
    if (evbuffer_get_length(bufferevent_get_input(bev))) answer_lines(c, 1);
}

static void on_client_event(struct bufferevent *bev, short events, void *arg) {
    client *c = arg;
    if (!(events & (BEV_EVENT_EOF | BEV_EVENT_ERROR))) return;
    struct evbuffer *in = bufferevent_get_input(bev);
    if ((events & BEV_EVENT_EOF) && !c->closing) {
        /* The client shut down its writing: answer what it sent (a last line may lack its
         * '\n'), then close once the replies are written. */
        answer_lines(c, 0);
        size_t len = evbuffer_get_length(in);
        if (!c->closing && len > 0) {
            char line[STATUS_LINE_MAX];
            evbuffer_remove(in, line, len);
            answer(c, line, len);
        }
    }
    if ((events & BEV_EVENT_ERROR) || evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        free_client(c);
        return;
    }
    c->closing = 1;
    bufferevent_disable(bev, EV_READ);
    arm_deadline(c);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    client *c = arg;
    if (!c->closing) {
        size_t pending = evbuffer_get_length(bufferevent_get_input(c->bev));
        log_event(-1, "status socket: dropped a client that sent %s within %d ms",
                  pending ? "half a request" : "no request", c->server->opt.timeout_ms);
        /* Best effort: the client may not be reading, and must not hold up the loop. */
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
            static const char msg[] = "{\"ok\":false,\"error\":\"no complete request line in time\"}\n";
            ssize_t sent = send(bufferevent_getfd(c->bev), msg, sizeof msg - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)sent;
        }
    }
    free_client(c);
}

/* ---- accepting ---- */

/* Who is calling: 0 for the daemon's own user, else -1 with the refusal. */
static int check_peer(int fd, char *why, size_t n) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        snprintf(why, n, "cannot read the peer's credentials: %s", strerror(errno));
        return -1;
    }
    if (cred.uid != geteuid()) {
        snprintf(why, n, "permission denied: uid %u is not the job's owner (uid %u)", (unsigned)cred.uid,
                 (unsigned)geteuid());
        log_event(-1, "status socket: refused pid %d (uid %u): not the job's owner", (int)cred.pid,
                  (unsigned)cred.uid);
        return -1;
    }
    return 0;
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr, int addrlen,
                      void *arg) {
    (void)l, (void)addr, (void)addrlen;
    status_server *s = arg;
    if (s->n_clients >= STATUS_CLIENTS_MAX) {
        static const char msg[] = "{\"ok\":false,\"error\":\"too many status clients at once; try again\"}\n";
        ssize_t sent = send(fd, msg, sizeof msg - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)sent;
        evutil_closesocket(fd);
        return;
    }
    client *c = calloc(1, sizeof *c);
    if (c) c->bev = bufferevent_socket_new(s->opt.base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (c && c->bev) c->deadline = evtimer_new(s->opt.base, on_deadline, c);
    if (!c || !c->bev || !c->deadline) {
        log_event(-1, "status socket: out of memory for a client");
        if (c && c->bev) bufferevent_free(c->bev);
        else evutil_closesocket(fd);
        free(c);
        return;
    }
    c->server = s;
    c->next = s->clients;
    if (s->clients) s->clients->prev = c;
    s->clients = c;
    s->n_clients++;
    bufferevent_setcb(c->bev, on_readable, on_written, on_client_event, c);
    /* Read no further than one line could go: a longer one is refused, not buffered. */
    bufferevent_setwatermark(c->bev, EV_READ, 0, STATUS_LINE_MAX);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    char why[256];
    if (check_peer(fd, why, sizeof why)) send_final_error(c, why);
    else arm_deadline(c);
}

static void on_resume_accept(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    status_server *s = arg;
    evconnlistener_enable(s->listener);
}

/* accept failed (out of file descriptors, say): pause for a second instead of spinning. */
static void on_accept_error(struct evconnlistener *l, void *arg) {
    status_server *s = arg;
    log_event(-1, "status socket: accept: %s; pausing for 1 s", strerror(EVUTIL_SOCKET_ERROR()));
    evconnlistener_disable(l);
    struct timeval second = {1, 0};
    evtimer_add(s->resume_accept, &second);
}

/* ---- the socket file ---- */

/* A socket file already at path: removed when nothing answers on it (its daemon died); an
 * error when something does, or when it is not a socket. */
static int clear_stale(const char *path, errbuf *err) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : errf(err, "%s: %s", path, strerror(errno));
    if (!S_ISSOCK(st.st_mode)) return errf(err, "%s exists and is not a socket: not replacing it", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errf(err, "socket: %s", strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int alive = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 || errno == EAGAIN;
    int e = errno;
    close(fd);
    if (alive) return errf(err, "%s: another process serves this status socket", path);
    if (e != ECONNREFUSED) return errf(err, "%s: %s", path, strerror(e));
    if (unlink(path) != 0 && errno != ENOENT) return errf(err, "%s: cannot remove: %s", path, strerror(errno));
    log_event(-1, "status socket %s: replaced a stale one (its daemon is gone)", path);
    return 0;
}

/* A listening socket at path, mode 0600 from the start. */
static int listen_at(status_server *s, errbuf *err) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(s->path) >= sizeof a.sun_path)
        return errf(err, "%s: longer than the %zu bytes of a Unix socket address", s->path, sizeof a.sun_path - 1);
    memcpy(a.sun_path, s->path, strlen(s->path) + 1);
    if (clear_stale(s->path, err)) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errf(err, "socket: %s", strerror(errno));
    /* The file gets its mode at bind, from the umask: no moment with wider permissions.
     * fsdpd binds before it starts any thread. */
    mode_t old = umask(0177);
    int bound = bind(fd, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    umask(old);
    struct stat st;
    int rc = 0;
    if (bound != 0) rc = errf(err, "%s: bind: %s", s->path, strerror(e));
    else if (chmod(s->path, 0600) != 0 || lstat(s->path, &st) != 0)
        rc = errf(err, "%s: %s", s->path, strerror(errno));
    else if (listen(fd, LISTEN_BACKLOG) != 0) rc = errf(err, "%s: listen: %s", s->path, strerror(errno));
    if (rc == 0) {
        s->dev = st.st_dev;
        s->ino = st.st_ino;
        s->listener = evconnlistener_new(s->opt.base, on_accept, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
                                         -1, fd);
        if (!s->listener) rc = errf(err, "%s: cannot listen on the event loop", s->path);
    }
    if (rc) {
        if (bound == 0) unlink(s->path);
        close(fd);
        return -1;
    }
    evconnlistener_set_error_cb(s->listener, on_accept_error);
    return 0;
}

int status_server_new(status_server **out, const status_server_options *opt, errbuf *err) {
    status_server *s = calloc(1, sizeof *s);
    if (!s) return errf(err, "out of memory");
    s->opt = *opt;
    if (!s->opt.timeout_ms) s->opt.timeout_ms = STATUS_REQUEST_TIMEOUT_S * 1000;
    if (snprintf(s->path, sizeof s->path, "%s", opt->path) >= (int)sizeof s->path) {
        free(s);
        return errf(err, "%s: longer than the %d bytes of a Unix socket address", opt->path, STATUS_SOCKET_MAX - 1);
    }
    s->resume_accept = evtimer_new(opt->base, on_resume_accept, s);
    if (!s->resume_accept) {
        free(s);
        return errf(err, "out of memory");
    }
    if (listen_at(s, err)) {
        event_free(s->resume_accept);
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

const char *status_server_path(const status_server *s) {
    return s->path;
}

void status_server_free(status_server *s) {
    if (!s) return;
    while (s->clients) free_client(s->clients);
    if (s->listener) evconnlistener_free(s->listener);
    event_free(s->resume_accept);
    /* Only the file this server made: another daemon may have replaced it since. */
    struct stat st;
    if (lstat(s->path, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino && unlink(s->path) != 0)
        log_event(-1, "%s: cannot remove: %s", s->path, strerror(errno));
    free(s->job);
    free(s);
}

/* ---- fsdpd's answers ---- */

typedef struct job_binding {
    status_job_hooks hooks;
    const job_config *job;
    status_place place;
    int node;
    char path[STATUS_SOCKET_MAX];
} job_binding;

/* VmRSS of /proc/PID/status in bytes, -1 when it cannot be read (the process is gone). */
static long long rss_bytes(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    return proc_kib_field(path, "VmRSS");
}

static json_t *json_count_or_null(long long v) {
    return v < 0 ? json_null() : json_integer(v);
}

json_t *status_rank_rows(const json_t *ranks, int cuda) {
    json_t *out = json_array();
    size_t i;
    const json_t *r;
    json_array_foreach(ranks, i, r) {
        json_t *row = json_deep_copy(r);
        if (json_object_get(r, "host_rss_bytes")) { /* another node's, as that node made it */
            json_array_append_new(out, row);
            continue;
        }
        int pid = (int)json_integer_value(json_object_get(r, "pid"));
        int running = json_is_true(json_object_get(r, "running"));
        json_object_set_new(row, "host_rss_bytes", json_count_or_null(running && pid > 0 ? rss_bytes(pid) : -1));
        const json_t *mem = json_object_get(r, "mem_bytes");
        json_object_set_new(row, "gpu_bytes", cuda && running && json_is_integer(mem) ? json_integer(json_integer_value(mem))
                                                                                     : json_null());
        json_object_del(row, "mem_bytes");
        json_array_append_new(out, row);
    }
    return out;
}

/* The last committed checkpoint (what `latest` names) and the saves being written (partial
 * directories; those of earlier runs were removed when this one started). */
static json_t *checkpoint_table(const char *dir) {
    char path[PATH_BYTES];
    errbuf err;
    json_t *last = json_null(), *in_flight = json_array();
    if (ckpt_resolve(dir, JOB_RESUME_AUTO, 0, path, sizeof path, &err) == 1) {
        const char *base = strrchr(path, '/');
        int64_t step;
        if (ckpt_parse_step_name(base ? base + 1 : path, &step)) {
            json_decref(last);
            last = json_pack("{s:I, s:s}", "step", (json_int_t)step, "path", path);
        }
    }
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        int64_t step;
        int attempt;
        if (!ckpt_parse_partial_name(e->d_name, &step, &attempt)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        json_array_append_new(in_flight, json_pack("{s:I, s:s}", "step", (json_int_t)step, "path", path));
    }
    if (d) closedir(d);
    return json_pack("{s:s, s:o, s:o}", "dir", dir, "last", last, "in_flight", in_flight);
}

static const char *backend_name(job_backend b) {
    return b == JOB_BACKEND_CUDA ? "cuda" : b == JOB_BACKEND_CPU ? "cpu" : "auto";
}

/* The numbers of rank 0's last step. */
static void add_progress(json_t *reply, const json_t *m) {
    const char *keys[] = {"step", "total_steps", "loss", "lr", "grad_norm", "tokens_seen"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(m, keys[i]);
        json_object_set_new(reply, keys[i], json_is_number(v) ? json_incref(v) : json_null());
    }
    double tokens = json_number_value(json_object_get(m, "tokens"));
    double secs = json_number_value(json_object_get(m, "seconds"));
    long long step = (long long)json_integer_value(json_object_get(m, "step"));
    long long total = (long long)json_integer_value(json_object_get(m, "total_steps"));
    int timed = json_is_number(json_object_get(m, "seconds")) && secs > 0;
    json_object_set_new(reply, "tokens_per_s", timed ? json_real(tokens / secs) : json_null());
    json_object_set_new(reply, "eta_s", timed && total >= step ? json_real((double)(total - step) * secs)
                                                               : json_null());
}

static json_t *job_status(job_binding *b) {
    json_t *sup = json_object();
    b->hooks.status(b->hooks.arg, sup);
    json_t *reply = json_pack("{s:{s:s, s:i, s:i, s:i}, s:O, s:O}", "job", "id", b->place.job_id, "node",
                              b->node, "restart", b->place.restart, "pid", (int)getpid(), "state",
                              json_object_get(sup, "state"), "stop_requested",
                              json_object_get(sup, "stop_requested"));
    if (reply) {
        add_progress(reply, json_object_get(sup, "metrics"));
        json_object_set_new(reply, "ranks", status_rank_rows(json_object_get(sup, "ranks"),
                                                             b->job->runtime.backend == JOB_BACKEND_CUDA));
        json_object_set(reply, "nodes", json_object_get(sup, "nodes"));
        json_t *ck = checkpoint_table(b->job->checkpoint.dir);
        if (ck && json_object_get(sup, "failed_saves")) {
            json_object_set(ck, "failed_saves", json_object_get(sup, "failed_saves"));
            json_object_set(ck, "last_save_error", json_object_get(sup, "last_save_error"));
        }
        json_object_set_new(reply, "checkpoint", ck);
        json_object_set_new(reply, "restarts", json_integer(b->place.restart));
        json_object_set(reply, "last_error", json_object_get(sup, "last_error"));
        json_object_set_new(reply, "backend", json_string(backend_name(b->job->runtime.backend)));
        json_object_set(reply, "fabric", json_object_get(sup, "fabric"));
        json_object_set(reply, "fabric_found", json_object_get(sup, "fabric_found"));
        json_object_set(reply, "behind", json_object_get(sup, "behind"));
        if (json_object_get(sup, "stragglers")) json_object_set(reply, "stragglers", json_object_get(sup, "stragglers"));
        json_object_set(reply, "eval", json_object_get(sup, "eval"));
        json_object_set_new(reply, "socket", json_string(b->path));
    }
    json_decref(sup);
    return reply;
}

static json_t *job_handle(void *arg, status_cmd cmd, errbuf *err) {
    job_binding *b = arg;
    json_t *reply = NULL;
    long long id;
    switch (cmd) {
    case STATUS_CMD_STATUS: reply = job_status(b); break;
    case STATUS_CMD_CHECKPOINT:
        id = b->hooks.request_checkpoint(b->hooks.arg, "status socket");
        if (id == 0) {
            errf(err, "the job is not training (starting or stopping): no checkpoint to take");
            return NULL;
        }
        if (id == STATUS_REQUEST_FORWARDED)
            reply = json_pack("{s:n, s:s}", "request", "message",
                              "checkpoint requested from the leader (node 0): every rank of the job saves at "
                              "the next step boundary where no save is still being written");
        else
            reply = json_pack("{s:I, s:s}", "request", (json_int_t)id, "message",
                              "checkpoint requested: the ranks save at the next step boundary where no save is "
                              "still being written");
        break;
    case STATUS_CMD_STOP:
        id = b->hooks.request_stop(b->hooks.arg, "stop requested on the status socket");
        if (id < 0 && id != STATUS_REQUEST_FORWARDED) {
            errf(err, "the job is already stopping");
            return NULL;
        }
        if (id == STATUS_REQUEST_FORWARDED)
            reply = json_pack("{s:n, s:s}", "checkpoint_request", "message",
                              "stopping: asked the leader (node 0); every node stops once its checkpoint is "
                              "committed");
        else
            reply = json_pack("{s:o, s:s}", "checkpoint_request", id ? json_integer(id) : json_null(), "message",
                              id ? "stopping: the workers stop once this checkpoint is committed"
                                 : "stopping now: the job is not training, there is nothing to save");
        break;
    }
    if (!reply) errf(err, "fsdpd: out of memory");
    return reply;
}

/* The default sockets' directory, made (0700) and checked; another user's there is refused. */
static int private_socket_dir(const char *dir, errbuf *err) {
    if (file_private_dir(dir, 1, err) == 0) return 0;
    errbuf why = *err;
    return errf(err, "%s: remove it, or set runtime.status_socket", why.msg);
}

int status_server_open(status_server **out, struct event_base *base, const status_job_hooks *hooks,
                       const job_config *job, int node, errbuf *err) {
    job_binding *b = calloc(1, sizeof *b);
    if (!b) return errf(err, "out of memory");
    *b = (job_binding){.hooks = *hooks, .job = job, .node = node};
    int rc = status_place_from_env(&b->place, err);
    if (rc == 0 && job->runtime.status_socket[0])
        snprintf(b->path, sizeof b->path, "%s", job->runtime.status_socket);
    else if (rc == 0)
        rc = private_socket_dir(b->place.dir, err) ||
             status_socket_path(b->path, sizeof b->path, b->place.dir, b->place.job_id, b->place.restart, node, err);
    status_server_options opt = {.base = base, .path = b->path, .handle = job_handle, .arg = b};
    if (rc == 0) rc = status_server_new(out, &opt, err);
    if (rc) {
        free(b);
        return errprefix(err, "status socket");
    }
    (*out)->job = b;
    log_event(-1, "status socket %s (job %s): fsdpctl status --socket %s", b->path, b->place.job_id, b->path);
    return 0;
}
