/* cluster: see cluster.h. */
#include "daemon/cluster.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "base/fileio.h"
#include "base/path.h"
#include "daemon/ckpt_commit.h"
#include "daemon/log.h"
#include "daemon/replica.h"
#include "daemon/pmix_join.h"

#define AUTH_CONTEXT "fsdpd daemons"

typedef struct node_link {
    cluster *c;
    int node;                /* the node at the other end */
    struct bufferevent *bev; /* NULL once closed */
    msg_decoder dec;
    int done;                /* it sent NODE_DONE, or it is gone */
    int lost;                /* it is gone: its link closed, or it fell silent */
    int joined;              /* it had a link in this run */
    double last_seen;        /* when it last sent anything */
    int heard;               /* it has sent a heartbeat: its loop runs */
    char state[16];          /* the leader's view of a follower: its last heartbeat */
    json_t *ranks;
    json_t *progress;        /* a follower's view of the leader: rank 0's last METRICS */
} node_link;

struct cluster {
    int node, nodes, workers; /* this node's index in the run, the run's node count */
    msg_nodes members;        /* the run's nodes by SLURM node index (node i is SLURM node id[i]) */
    msg_nodes spares;         /* the leader: the spare nodes it expects (runtime.spare_nodes) */
    int total;                /* links: the run's nodes, then the spares' (index nodes + k) */
    char host[MSG_ADDR_MAX];
    char secret_hex[2 * MSG_SECRET_BYTES + 1];
    unsigned char secret[MSG_SECRET_BYTES];
    char file[PATH_BYTES];   /* the leader's rendezvous file, removed with the cluster */
    int *fds;                /* [nodes]: the leader's node_link to each node; a follower's [0] */
    char (*hosts)[MSG_ADDR_MAX + 8]; /* [nodes]: each node's address (a follower: the leader's at [0]) */
    int heartbeat_s, node_timeout_s, join_timeout_s;
    node_link *links;             /* the same once attached */
    cluster_hooks hooks;
    struct event_base *base;
    struct event *heartbeat;
    /* the leader's rank table, filled node by node */
    msg_peers table;
    int n_addrs, n_ready, n_done, failed, finished;
    int leader_stopped; /* a follower: the leader's STOP came */
    int standby;        /* a spare's cluster (cluster_stand_by): node is nodes, its SLURM index spares.id[0] */
    int permanent;      /* the failure told to the others (or by them) is one no restart cures */
    int told_leader;    /* a follower: its NODE_DONE went */
    /* the in-memory checkpoint each node of the run holds (msg_join.memory_step; the leader
     * knows every node's, a follower its own), -1 for none */
    int64_t memory_steps[MSG_NODES_MAX];
    int *replica_ports;  /* [total]: the leader: each spare's (msg_join.replica_port) */
    int replica_port;    /* a spare's own, sent in its JOIN */
};

int cluster_node(const cluster *c) { return c->node; }
int cluster_nodes(const cluster *c) { return c->nodes; }
const char *cluster_host(const cluster *c) { return c->host; }
const char *cluster_secret_hex(const cluster *c) { return c->secret_hex; }
static int is_leader(const cluster *c) { return c->node == 0; }
/* Node i of the run (or spare i - nodes) as the log names it: its SLURM node index. */
static int slurm_node(const cluster *c, int i) { return i < c->nodes ? c->members.id[i] : c->spares.id[i - c->nodes]; }
static int is_spare_link(const cluster *c, int i) { return i >= c->nodes; }

/* PMIx carries the leader's address and the secret at a launch's first run, when every node
 * of the allocation takes part in its fence; a restart's run, perhaps without a node that is
 * gone, meets through the rendezvous file alone (0600, the secret in it). */
static int use_pmix(int attempt) { return pmix_join_active() && attempt == 0; }

static int random_bytes(unsigned char *out, size_t n, errbuf *err) {
    if (getrandom(out, n, 0) != (ssize_t)n) return errf(err, "getrandom: %s", strerror(errno));
    return 0;
}

/* ---- this node's address ---- */

static int is_loopback(const struct sockaddr_in *a) { return (ntohl(a->sin_addr.s_addr) >> 24) == 127; }

/* runtime.bind_addr, else the first IPv4 address this node's name resolves to. */
static int node_address(cluster *c, const slurm_env *env, const job_config *job, errbuf *err) {
    char name[SLURM_HOST_MAX];
    if (job->runtime.bind_addr[0]) snprintf(name, sizeof name, "%s", job->runtime.bind_addr);
    else if (env->nodename[0]) snprintf(name, sizeof name, "%s", env->nodename);
    else if (gethostname(name, sizeof name) != 0) return errf(err, "gethostname: %s", strerror(errno));
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(name, NULL, &hints, &res);
    if (rc) return errf(err, "this node's address: %s: %s", name, gai_strerror(rc));
    struct sockaddr_in a = *(struct sockaddr_in *)res->ai_addr;
    freeaddrinfo(res);
    if (c->total > 1 && is_loopback(&a))
        return errf(err, "this node's address: %s is %s, a loopback address: the other nodes cannot reach "
                    "it (set runtime.bind_addr)", name, inet_ntoa(a.sin_addr));
    snprintf(c->host, sizeof c->host, "%s", inet_ntoa(a.sin_addr));
    return 0;
}

/* ---- the rendezvous file ---- */

/* A strange connection to the leader's port must prove the secret and JOIN within this, apart
 * from runtime.join_timeout_s: one that sends nothing, or a byte at a time, is dropped while
 * the real nodes join beside it. */
#define HANDSHAKE_S 5.0
#define MAX_PENDING 32 /* connections authenticating at once; past it the oldest is dropped */
#define SPARE_WAIT_S 30.0 /* a spare that has not joined this long after the run's nodes is none */
#define RENDEZVOUS_MAX (1 << 16)

static int rendezvous_path(char *out, const slurm_env *env, const job_config *job, int attempt, errbuf *err) {
    char name[160];
    snprintf(name, sizeof name, "fsdpd-rendezvous-%s-r%d-a%d.json", env->job_id, env->restart_count, attempt);
    return path_join(out, PATH_BYTES, job->checkpoint.dir, name, err);
}

/* What every node of this launch computes alike: a second srun in one allocation (another
 * SLURM_STEP_ID) never takes the file of the first for its own. */
static void launch_name(char *out, size_t n, const slurm_env *env, int attempt) {
    snprintf(out, n, "job %s step %s restart %d attempt %d", env->job_id, env->step_id[0] ? env->step_id : "-",
             env->restart_count, attempt);
}

/* Removes the rendezvous files earlier runs of this job left (a leader that was killed cannot
 * remove its own): they hold an old secret, and nothing reads them again. */
static void remove_stale_rendezvous(const cluster *c, const slurm_env *env, const char *dir) {
    char prefix[128];
    snprintf(prefix, sizeof prefix, "fsdpd-rendezvous-%s-r", env->job_id);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[PATH_BYTES];
        errbuf ignored;
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || path_join(path, sizeof path, dir, e->d_name, &ignored) ||
            strcmp(path, c->file) == 0)
            continue;
        if (unlink(path) == 0) log_event(-1, "removed %s, left by an earlier run", path);
    }
    if (d) closedir(d);
}

static int write_rendezvous(const char *path, const msg *m, errbuf *err) {
    json_t *o = msg_to_json(m, err);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) return errf(err, "%s: cannot encode the rendezvous file", path);
    file_chunk chunk = {text, strlen(text)};
    int rc = file_write_atomic_mode(path, &chunk, 1, 0600, err);
    free(text);
    return rc;
}

static msg rendezvous_of(const slurm_env *env, int attempt) {
    msg m = {.type = MSG_RENDEZVOUS, .u.rendezvous = {.restart = env->restart_count, .attempt = attempt}};
    snprintf(m.u.rendezvous.job_id, sizeof m.u.rendezvous.job_id, "%s", env->job_id);
    launch_name(m.u.rendezvous.launch, sizeof m.u.rendezvous.launch, env, attempt);
    return m;
}

static int publish(cluster *c, int port, const slurm_env *env, int attempt, const char *nonce, errbuf *err) {
    msg m = rendezvous_of(env, attempt);
    msg_rendezvous *r = &m.u.rendezvous;
    r->port = port;
    r->nodes = c->nodes;
    snprintf(r->host, sizeof r->host, "%s", c->host);
    strcpy(r->secret, use_pmix(attempt) ? "" : c->secret_hex); /* with PMIx, the secret goes through it */
    strcpy(r->nonce, nonce);
    r->members = c->members;
    return write_rendezvous(c->file, &m, err);
}

int cluster_end_launch(const slurm_env *env, const job_config *job, int attempt, const char *why, errbuf *err) {
    msg m = rendezvous_of(env, attempt);
    m.u.rendezvous.nodes = m.u.rendezvous.members.n = 1;
    snprintf(m.u.rendezvous.ended, sizeof m.u.rendezvous.ended, "%s", why[0] ? why : "the job ended");
    char path[PATH_BYTES];
    return rendezvous_path(path, env, job, attempt, err) || write_rendezvous(path, &m, err) ? -1 : 0;
}

/* One look at the leader's file: 1 with it in *out; 0 when it is not there for this launch
 * yet (why says what was seen: missing, incomplete, an earlier launch's); -1 when it is there
 * but cannot be trusted (another uid's, readable by others, not a regular file). */
static int look_for_rendezvous(const char *path, const char *launch, msg_rendezvous *out, char *why, size_t n,
                               errbuf *err) {
    char *text;
    size_t len;
    int rc = file_read_private(path, RENDEZVOUS_MAX, &text, &len, err);
    if (rc) {
        if (rc > 0) snprintf(why, n, "no rendezvous file %s: checkpoint.dir must be one directory shared by every node",
                             path);
        return rc > 0 ? 0 : -1;
    }
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    free(text);
    msg m;
    errbuf bad = {"not JSON yet"};
    rc = o && msg_from_json(&m, MSG_RENDEZVOUS, o, &bad) == 0;
    json_decref(o);
    if (!rc) {
        snprintf(why, n, "the rendezvous file %s is not a whole one (%.200s)", path, bad.msg);
        return 0;
    }
    if (strcmp(m.u.rendezvous.launch, launch) != 0) {
        snprintf(why, n, "the rendezvous file %s is of another launch (%s, this one is %s): its leader never wrote "
                 "this launch's", path, m.u.rendezvous.launch, launch);
        return 0;
    }
    *out = m.u.rendezvous;
    return 1;
}

/* Waits for this launch's file from the leader until the deadline. */
static int read_rendezvous(const char *path, const char *launch, msg_rendezvous *out, double deadline, errbuf *err) {
    char why[PATH_BYTES + 512];
    for (;;) {
        int rc = look_for_rendezvous(path, launch, out, why, sizeof why, err);
        if (rc > 0 && out->ended[0]) return errf(err, "the leader ended the job without this run: %s", out->ended);
        if (rc) return rc > 0 ? 0 : -1;
        if (clock_now_s() > deadline) return errf(err, "%s", why);
        clock_sleep_s(0.1);
    }
}

/* ---- the leader's side of the join ---- */

static int listen_on(const char *host, int *port, errbuf *err) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errf(err, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof a;
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(fd, 64) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(fd);
        return errf(err, "cannot listen on %s: %s", host, strerror(e));
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static int set_blocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

/* A connection the leader has accepted and not yet admitted: authenticating, then its JOIN. */
typedef struct pending {
    int fd;
    char peer[64];   /* address:port, for the log */
    double deadline; /* HANDSHAKE_S after it was accepted */
    auth_session auth;
    int authed;
    msg_decoder dec;
} pending;

/* What the leader's join holds while the nodes come in. */
typedef struct admission {
    cluster *c;
    const char *nonce;
    json_t *settings; /* this node's job_shared_settings */
    pending p[MAX_PENDING];
    int n;
    int joined, spares_joined;
} admission;

/* Tells a node that authenticated why it is turned away (best effort: it closes next). */
static void send_refusal(int fd, const char *reason) {
    msg m = {.type = MSG_REFUSED};
    snprintf(m.u.refused.reason, sizeof m.u.refused.reason, "%s", reason);
    errbuf ignored;
    msg_send(fd, &m, &ignored);
}

/* A spare's JOIN: its link index (nodes + k), or -1 with why. */
static int judge_spare(admission *a, const msg_join *j, errbuf *why) {
    cluster *c = a->c;
    if (j->workers != c->workers)
        return errf(why, "JOIN from spare SLURM node %d: %d workers, the leader has %d", j->slurm_node, j->workers,
                    c->workers);
    if (strcmp(j->nonce, a->nonce) != 0)
        return errf(why, "JOIN from spare SLURM node %d: it did not read this run's rendezvous file", j->slurm_node);
    int k = 0;
    while (k < c->spares.n && c->spares.id[k] != j->slurm_node) k++;
    if (k == c->spares.n)
        return errf(why, "JOIN from %s as a spare: SLURM node %d is not a spare this run expects", j->host, j->slurm_node);
    if (c->fds[c->nodes + k] >= 0) return errf(why, "JOIN from a second spare SLURM node %d (%s)", j->slurm_node, j->host);
    return c->nodes + k;
}

/* A member's JOIN: its link index (its node index), or -1 with why. */
static int judge_member(admission *a, const msg_join *j, errbuf *why) {
    cluster *c = a->c;
    if (j->nodes != c->nodes || j->node < 1 || j->node >= c->nodes)
        return errf(why, "JOIN from %s: node %d of %d, but this job has %d nodes (its leader is node 0)", j->host,
                    j->node, j->nodes, c->nodes);
    if (j->workers != c->workers)
        return errf(why, "JOIN from node %d: %d workers, the leader has %d", j->node, j->workers, c->workers);
    if (strcmp(j->nonce, a->nonce) != 0)
        return errf(why, "JOIN from node %d: it did not read this run's rendezvous file", j->node);
    if (c->fds[j->node] >= 0)
        return errf(why, "JOIN from a second node %d (%s): node %d already joined from %s", j->node, j->host,
                    j->node, c->hosts[j->node]);
    if (j->slurm_node != c->members.id[j->node])
        return errf(why, "JOIN from node %d (%s): SLURM node %d, but node %d of this run is SLURM node %d", j->node,
                    j->host, j->slurm_node, j->node, c->members.id[j->node]);
    return j->node;
}

/* A JOIN from a node that proved the secret: 0 it fits (*link: where it goes), -1 it does
 * not (why: a node of this job misconfigured, or of another run; the join goes on), -2 it
 * runs another job (why: the whole job stops, every node told). */
static int judge_join(admission *a, const msg_join *j, int *link, errbuf *why) {
    if ((*link = j->standby ? judge_spare(a, j, why) : judge_member(a, j, why)) < 0) return -1;
    job_difference d;
    if (job_settings_diff(a->settings, j->settings, &d)) {
        errf(why, "node %d (%s) runs another job: %s is %s on the leader, %s on node %d", j->slurm_node, j->host,
             d.key, d.a, d.b, j->slurm_node);
        return -2;
    }
    return 0;
}

static void drop_pending(admission *a, int i, const char *what) {
    pending *p = &a->p[i];
    if (what) log_event(-1, "refused a connection from %s: %s", p->peer, what);
    if (p->fd >= 0) close(p->fd);
    msg_decoder_free(&p->dec);
    a->p[i] = a->p[--a->n];
}

/* The JOIN that follows the handshake: 1 once it is judged (*node: the node admitted, or 0
 * with why; *fatal when it runs another job), 0 while it is still coming. */
static int read_join(admission *a, pending *p, int *node, int *fatal, errbuf *why) {
    unsigned char chunk[4096];
    ssize_t got;
    while ((got = recv(p->fd, chunk, sizeof chunk, MSG_DONTWAIT)) > 0)
        if (msg_decoder_feed(&p->dec, chunk, (size_t)got, why)) return 1;
    msg_frame f;
    int rc = msg_decoder_next(&p->dec, &f, why);
    if (rc < 0) return errprefix(why, "waiting for JOIN"), 1;
    if (rc == 0) {
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
        return errf(why, "it closed the connection before its JOIN"), 1;
    }
    msg m;
    rc = msg_decode(&f, &m, why);
    msg_frame_free(&f);
    if (rc) return errprefix(why, "its JOIN"), 1;
    if (m.type != MSG_JOIN) rc = errf(why, "expected JOIN, got %s", msg_type_name(m.type));
    else rc = judge_join(a, &m.u.join, node, why);
    *fatal = rc == -2;
    if (rc == 0) {
        if (*node < a->c->nodes) a->c->memory_steps[*node] = m.u.join.memory_step;
        a->c->replica_ports[*node] = m.u.join.replica_port;
        snprintf(a->c->hosts[*node], sizeof a->c->hosts[*node], "%s", m.u.join.host);
        log_event(-1, "%snode %d (%s) joined", is_spare_link(a->c, *node) ? "spare " : "", slurm_node(a->c, *node),
                  m.u.join.host);
    } else {
        *node = 0;
    }
    msg_free(&m);
    return 1;
}

/* Moves connection i on as far as its bytes allow: it authenticates, then JOINs, and is
 * admitted (its fd becomes the node's) or refused.  -1 (err) when the whole join fails. */
static int step_pending(admission *a, int i, errbuf *err) {
    pending *p = &a->p[i];
    errbuf why;
    if (!p->authed) {
        int rc = auth_step(&p->auth, p->fd, &why);
        if (rc < 0) return drop_pending(a, i, why.msg), 0;
        if (rc == 0) return 0;
        p->authed = 1;
    }
    int node = 0, fatal = 0;
    if (!read_join(a, p, &node, &fatal, &why)) return 0;
    if (node > 0 && set_blocking(p->fd) == 0) {
        a->c->fds[node] = p->fd;
        p->fd = -1;
        if (is_spare_link(a->c, node)) a->spares_joined++;
        else a->joined++;
        drop_pending(a, i, NULL);
        return 0;
    }
    if (node > 0) errf(&why, "node %d: fcntl: %s", node, strerror(errno));
    send_refusal(p->fd, why.msg);
    drop_pending(a, i, why.msg);
    return fatal ? errf(err, "%s", why.msg) : 0;
}

/* Accepts what waits on the listening socket; a connection past MAX_PENDING makes room by
 * dropping the oldest (the nearest its deadline). */
static void accept_pending(admission *a, int lfd) {
    for (;;) {
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        int fd = accept4(lfd, (struct sockaddr *)&from, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return;
        if (a->n == MAX_PENDING) {
            int oldest = 0;
            for (int i = 1; i < a->n; i++)
                if (a->p[i].deadline < a->p[oldest].deadline) oldest = i;
            drop_pending(a, oldest, "too many connections authenticating at once");
        }
        pending *p = &a->p[a->n];
        errbuf why;
        *p = (pending){.fd = fd, .deadline = clock_now_s() + HANDSHAKE_S};
        snprintf(p->peer, sizeof p->peer, "%s:%d", inet_ntoa(from.sin_addr), ntohs(from.sin_port));
        msg_decoder_init(&p->dec);
        a->n++;
        if (auth_start(&p->auth, a->c->secret, sizeof a->c->secret, 0, AUTH_CONTEXT, &why))
            drop_pending(a, a->n - 1, why.msg);
    }
}

static void missing_nodes(const cluster *c, char *out, size_t n) {
    msg_nodes missing = {0};
    for (int i = 1; i < c->nodes; i++)
        if (c->fds[i] < 0) missing.id[missing.n++] = slurm_node(c, i);
    msg_nodes_list(&missing, out, n);
}

/* One round: every connection whose handshake ran out is dropped, then poll() until the
 * nearest deadline, then every connection that is ready is moved on. */
static int admit_round(admission *a, int lfd, double deadline, errbuf *err) {
    double now = clock_now_s(), wake = deadline;
    for (int i = a->n - 1; i >= 0; i--)
        if (a->p[i].deadline <= now) {
            char what[96];
            snprintf(what, sizeof what, "no %s within %.0f s", a->p[i].authed ? "JOIN" : "authentication", HANDSHAKE_S);
            drop_pending(a, i, what);
        }
    struct pollfd fds[MAX_PENDING + 1] = {{.fd = lfd, .events = POLLIN}};
    for (int i = 0; i < a->n; i++) {
        fds[i + 1] = (struct pollfd){.fd = a->p[i].fd, .events = a->p[i].authed ? POLLIN : auth_events(&a->p[i].auth)};
        if (a->p[i].deadline < wake) wake = a->p[i].deadline;
    }
    int n = a->n;
    if (poll(fds, (nfds_t)n + 1, clock_poll_ms(wake)) < 0 && errno != EINTR)
        return errf(err, "poll: %s", strerror(errno));
    /* From the last: step_pending may move the last connection into a dropped one's slot. */
    for (int i = n - 1; i >= 0; i--)
        if (fds[i + 1].revents && step_pending(a, i, err)) return -1;
    if (fds[0].revents & POLLIN) accept_pending(a, lfd);
    return 0;
}

/* The leader could not start the job: every node that joined hears why. */
static void refuse_joined(cluster *c, const char *reason) {
    for (int i = 1; i < c->total; i++)
        if (c->fds[i] >= 0) send_refusal(c->fds[i], reason);
}

static int admit_nodes(cluster *c, const job_config *job, int lfd, const char *nonce, double deadline, errbuf *err) {
    admission a = {.c = c, .nonce = nonce, .joined = 1};
    int rc = 0;
    json_t *model = NULL;
    llama_config ignored;
    if (ckpt_job_model_config(job, &model, &ignored, err) || !(a.settings = job_shared_settings(job, model, err)))
        rc = -1;
    json_decref(model);
    double spares_by = 0; /* once every node has joined, the spares get SPARE_WAIT_S more */
    while (rc == 0 && (a.joined < c->nodes || a.spares_joined < c->spares.n)) {
        if (a.joined == c->nodes && spares_by == 0)
            spares_by = clock_now_s() + SPARE_WAIT_S < deadline ? clock_now_s() + SPARE_WAIT_S : deadline;
        if (spares_by > 0 && clock_now_s() >= spares_by) { /* the spares missing: without them */
            for (int k = 0; k < c->spares.n; k++)
                if (c->fds[c->nodes + k] < 0)
                    log_event(-1, "spare node %d did not join with the others: it is no spare", c->spares.id[k]);
            break;
        }
        if (clock_now_s() >= deadline) {
            char missing[256];
            missing_nodes(c, missing, sizeof missing);
            rc = errf(err, "node(s) %s never joined within runtime.join_timeout_s = %d s", missing,
                      job->runtime.join_timeout_s);
            break;
        }
        rc = admit_round(&a, lfd, spares_by > 0 ? spares_by : deadline, err);
    }
    while (a.n > 0) drop_pending(&a, a.n - 1, rc ? "the leader gave up the join" : "every node had joined");
    json_decref(a.settings);
    if (rc) refuse_joined(c, err->msg);
    return rc;
}

static int lead(cluster *c, const slurm_env *env, const job_config *job, int attempt, double deadline, errbuf *err) {
    int port = 0, lfd = listen_on(c->host, &port, err);
    if (lfd < 0) return -1;
    unsigned char raw[16];
    char nonce[MSG_NONCE_HEX];
    int rc = random_bytes(raw, sizeof raw, err);
    hex_encode(raw, sizeof raw, nonce);
    if (rc == 0) rc = file_mkdir_p(job->checkpoint.dir, err);
    if (rc == 0) rc = rendezvous_path(c->file, env, job, attempt, err);
    if (rc == 0) remove_stale_rendezvous(c, env, job->checkpoint.dir);
    if (rc == 0) rc = publish(c, port, env, attempt, nonce, err);
    if (rc == 0 && use_pmix(attempt))
        rc = pmix_join_lead(c->host, port, c->secret_hex, attempt, job->runtime.join_timeout_s, err);
    if (rc == 0) log_event(-1, "leading %d nodes from %s:%d (rendezvous file %s)", c->nodes, c->host, port, c->file);
    if (rc == 0) rc = admit_nodes(c, job, lfd, nonce, deadline, err);
    close(lfd);
    return rc;
}

/* ---- a follower's side ---- */

/* One attempt at the leader the file names: connected, the secret proven both ways, JOIN
 * sent.  The fd, or -1 with why (the caller reads the file again and retries). */
static int join_leader(cluster *c, const msg_rendezvous *r, const json_t *settings, double deadline, errbuf *why) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->port)};
    if (inet_pton(AF_INET, r->host, &a.sin_addr) != 1) return errf(why, "leader address '%s' is not IPv4", r->host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errf(why, "socket: %s", strerror(errno));
    msg join = {.type = MSG_JOIN, .u.join = {.node = c->standby ? 0 : c->node, .nodes = c->nodes,
                                             .slurm_node = slurm_node(c, c->node), .standby = c->standby != 0,
                                             .workers = c->workers, .settings = (json_t *)settings,
                                             .memory_step = c->standby ? -1 : c->memory_steps[c->node],
                                             .replica_port = c->replica_port}};
    snprintf(join.u.join.host, sizeof join.u.join.host, "%s", c->host);
    strcpy(join.u.join.nonce, r->nonce);
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 ? 0 : errf(why, "%s", strerror(errno));
    if (rc == 0) rc = auth_handshake(fd, c->secret, sizeof c->secret, 1, AUTH_CONTEXT, deadline, why);
    if (rc == 0) rc = msg_send(fd, &join, why);
    if (rc) {
        close(fd);
        return errprefix(why, "the leader at %s:%d", r->host, r->port);
    }
    return fd;
}

/* The leader's address and secret: its file (with PMIx, the address and secret from PMIx and
 * the nonce from the file), which must be this launch's and trusted (file_read_private). */
static int find_leader(cluster *c, const slurm_env *env, const job_config *job, int attempt, const pmix_join_endpoint *ep,
                       msg_rendezvous *r, double deadline, errbuf *err) {
    char path[PATH_BYTES], launch[128];
    launch_name(launch, sizeof launch, env, attempt);
    if (rendezvous_path(path, env, job, attempt, err) || read_rendezvous(path, launch, r, deadline, err)) return -1;
    if (ep) {
        snprintf(r->host, sizeof r->host, "%s", ep->host);
        r->port = ep->port;
        strcpy(r->secret, ep->secret_hex);
    }
    if (r->members.n != c->members.n || memcmp(r->members.id, c->members.id, (size_t)c->members.n * sizeof(int)))
        return errf(err, "%s: the leader runs %d node(s), this node expected %d (its SLURM_NNODES, less "
                    "runtime.spare_nodes, or the attempt's nodes)", path, r->members.n, c->members.n);
    if (hex_decode(r->secret, c->secret, sizeof c->secret)) return errf(err, "%s: a malformed secret", path);
    strcpy(c->secret_hex, r->secret);
    return 0;
}

/* Until the deadline: the file read again after every failed attempt, since a relaunch's
 * leader may replace a dead one's file (another port, another secret) at any moment. */
static int follow(cluster *c, const slurm_env *env, const job_config *job, int attempt, double deadline, errbuf *err) {
    pmix_join_endpoint ep; /* with PMIx: the leader's address and the secret, before the file exists */
    int pmix = use_pmix(attempt);
    if (pmix && pmix_join_follow(&ep, env->node_id, attempt, job->runtime.join_timeout_s, err)) return -1;
    json_t *model = NULL, *settings = NULL;
    llama_config ignored;
    if (ckpt_job_model_config(job, &model, &ignored, err) == 0) settings = job_shared_settings(job, model, err);
    json_decref(model);
    if (!settings) return -1;
    msg_rendezvous r;
    int fd = -1;
    char last[MSG_TEXT_MAX] = "";
    while (fd < 0) {
        if (find_leader(c, env, job, attempt, pmix ? &ep : NULL, &r, deadline, err)) break;
        errbuf why;
        if ((fd = join_leader(c, &r, settings, deadline, &why)) >= 0) break;
        if (clock_now_s() > deadline) {
            errf(err, "cannot join: %s", why.msg);
            break;
        }
        if (strcmp(last, why.msg)) log_event(-1, "%s; trying again until runtime.join_timeout_s", why.msg);
        snprintf(last, sizeof last, "%s", why.msg);
        clock_sleep_s(0.2);
    }
    json_decref(settings);
    if (fd < 0) return -1;
    c->fds[0] = fd;
    snprintf(c->hosts[0], sizeof c->hosts[0], "%s:%d", r.host, r.port);
    if (c->standby)
        log_event(-1, "node %d joined the leader at %s:%d as a spare", slurm_node(c, c->node), r.host, r.port);
    else
        log_event(-1, "node %d joined the leader at %s:%d (node %d of the run's %d)", slurm_node(c, c->node), r.host,
                  r.port, c->node, c->nodes);
    return 0;
}

int cluster_members(const slurm_env *env, const job_config *job, int attempt, msg_nodes *out, errbuf *err) {
    char path[PATH_BYTES], launch[128];
    msg_rendezvous r;
    launch_name(launch, sizeof launch, env, attempt);
    if (rendezvous_path(path, env, job, attempt, err) ||
        read_rendezvous(path, launch, &r, clock_now_s() + job->runtime.join_timeout_s, err))
        return errprefix(err, "joining the nodes");
    *out = r.members;
    return 0;
}

/* This node's index in the run: where members lists its SLURM node index. */
static int index_in(const msg_nodes *members, int slurm_id) {
    for (int i = 0; i < members->n; i++)
        if (members->id[i] == slurm_id) return i;
    return -1;
}

/* A cluster of the run's members and spares, its links not made; NULL when out of memory. */
static cluster *cluster_new(const job_config *job, const msg_nodes *members, const msg_nodes *spares) {
    cluster *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->members = *members;
    if (spares) c->spares = *spares;
    c->nodes = members->n;
    c->total = c->nodes + c->spares.n;
    c->workers = job->runtime.workers_per_node;
    c->heartbeat_s = job->runtime.heartbeat_s;
    c->node_timeout_s = job->runtime.node_timeout_s;
    c->join_timeout_s = job->runtime.join_timeout_s;
    c->fds = malloc((size_t)c->total * sizeof *c->fds);
    c->hosts = calloc((size_t)c->total, sizeof *c->hosts);
    c->replica_ports = calloc((size_t)c->total, sizeof *c->replica_ports);
    if (!c->fds || !c->hosts || !c->replica_ports) {
        cluster_free(c);
        return NULL;
    }
    for (int i = 0; i < c->total; i++) c->fds[i] = -1;
    for (int i = 0; i < MSG_NODES_MAX; i++) c->memory_steps[i] = -1;
    return c;
}

int cluster_join(cluster **out, const slurm_env *env, const job_config *job, const msg_nodes *members,
                 const msg_nodes *spares, int attempt, int64_t memory_step, errbuf *err) {
    int node = index_in(members, env->node_id);
    if (node < 0 || members->id[0] != 0)
        return errf(err, "joining the nodes: SLURM node %d is not one of this run's nodes", env->node_id);
    cluster *c = cluster_new(job, members, node == 0 ? spares : NULL);
    if (!c) return errf(err, "out of memory");
    c->node = node;
    c->memory_steps[node] = memory_step;
    int rc = 0;
    if (c->total == 1) {
        const char *host = job->runtime.bind_addr[0] ? job->runtime.bind_addr : "127.0.0.1";
        if ((size_t)snprintf(c->host, sizeof c->host, "%s", host) >= sizeof c->host)
            rc = errf(err, "runtime.bind_addr '%.64s...' is too long", host);
    } else {
        rc = node_address(c, env, job, err);
    }
    if (rc == 0) snprintf(c->hosts[c->node], sizeof c->hosts[c->node], "%s", c->host);
    if (rc == 0 && is_leader(c)) {
        rc = random_bytes(c->secret, sizeof c->secret, err);
        hex_encode(c->secret, sizeof c->secret, c->secret_hex);
    }
    double deadline = clock_now_s() + job->runtime.join_timeout_s;
    if (rc == 0 && c->total > 1)
        rc = is_leader(c) ? lead(c, env, job, attempt, deadline, err) : follow(c, env, job, attempt, deadline, err);
    if (rc) {
        cluster_free(c);
        return errprefix(err, "joining the nodes");
    }
    *out = c;
    return 0;
}

/* ---- a spare ---- */

/* One of the leader's messages to a spare: 0 (failed) or 2 (ended) for STOP, -2 to go on
 * waiting, -1 (err) for anything a spare is not sent. */
static int spare_on(const msg *m, errbuf *err) {
    switch (m->type) {
    case MSG_NODE_HEARTBEAT: return -2;
    case MSG_STOP:
        log_event(-1, "the run %s: %s", m->u.stop.failed ? "failed" : "ended", m->u.stop.reason);
        return m->u.stop.failed ? 0 : 2;
    case MSG_REFUSED: return errf(err, "the leader refused this node: %s", m->u.refused.reason);
    default: return errf(err, "the leader sent a spare an unexpected %s message", msg_type_name(m->type));
    }
}

/* A spare joined: heartbeats the leader every heartbeat_s and reads it until its STOP, or
 * until it is lost (closed, silent for node_timeout_s). */
static int wait_as_spare(cluster *c, errbuf *err) {
    int fd = c->fds[0], rc = -2;
    msg_decoder dec;
    msg_decoder_init(&dec);
    double heard = clock_now_s(), beat = 0;
    while (rc == -2) {
        double now = clock_now_s();
        errbuf why;
        if (now - heard > c->node_timeout_s) {
            rc = errf(err, "the leader (node 0, %s) sent nothing for %.0f s (runtime.node_timeout_s = %d s)",
                      c->hosts[0], now - heard, c->node_timeout_s);
            break;
        }
        if (now >= beat) {
            msg hb = {.type = MSG_NODE_HEARTBEAT, .u.node_heartbeat = {.node = slurm_node(c, c->node), .state = "spare"}};
            if (msg_send(fd, &hb, &why)) {
                rc = errf(err, "the leader (node 0, %s): %s", c->hosts[0], why.msg);
                break;
            }
            beat = now + c->heartbeat_s;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, clock_poll_ms(beat));
        if (n < 0 && errno != EINTR) rc = errf(err, "poll: %s", strerror(errno));
        if (n <= 0) continue;
        unsigned char chunk[4096];
        ssize_t got = recv(fd, chunk, sizeof chunk, 0);
        if (got <= 0) {
            rc = errf(err, "the leader (node 0, %s) closed its connection (its daemon died?)", c->hosts[0]);
            break;
        }
        heard = clock_now_s();
        msg_frame f;
        int more = msg_decoder_feed(&dec, chunk, (size_t)got, &why) ? -1 : 1;
        while (rc == -2 && more > 0 && (more = msg_decoder_next(&dec, &f, &why)) > 0) {
            msg m;
            int bad = msg_decode(&f, &m, &why);
            msg_frame_free(&f);
            if (bad) more = -1;
            else rc = spare_on(&m, err), msg_free(&m);
        }
        if (more < 0) rc = errf(err, "the leader (node 0, %s) broke the protocol: %s", c->hosts[0], why.msg);
    }
    msg_decoder_free(&dec);
    return rc;
}

int cluster_stand_by(const slurm_env *env, const job_config *job, int attempt, replica_sink *sink, msg_nodes *members,
                     errbuf *err) {
    if (cluster_members(env, job, attempt, members, err)) return -1;
    if (index_in(members, env->node_id) >= 0) return 1;
    msg_nodes self = {.n = 1, .id = {env->node_id}};
    cluster *c = cluster_new(job, members, &self);
    if (!c) return errf(err, "out of memory");
    c->node = c->nodes; /* its link's index on the leader's side */
    c->standby = 1;
    c->replica_port = sink ? replica_sink_port(sink) : 0;
    int rc = node_address(c, env, job, err);
    if (rc == 0) {
        snprintf(c->hosts[c->node], sizeof c->hosts[c->node], "%s", c->host);
        rc = follow(c, env, job, attempt, clock_now_s() + job->runtime.join_timeout_s, err);
    }
    if (rc == 0 && sink) replica_sink_secret(sink, c->secret, sizeof c->secret); /* this run's */
    if (rc == 0) rc = wait_as_spare(c, err);
    cluster_free(c);
    return rc < 0 ? errprefix(err, "a spare node") : rc;
}

void cluster_detach(cluster *c) {
    if (c->heartbeat) event_free(c->heartbeat);
    c->heartbeat = NULL;
    for (int i = 0; c->links && i < c->total; i++) {
        if (c->links[i].bev) bufferevent_free(c->links[i].bev);
        c->links[i].bev = NULL;
        msg_decoder_free(&c->links[i].dec);
        json_decref(c->links[i].ranks);
        c->links[i].ranks = NULL;
        json_decref(c->links[i].progress);
        c->links[i].progress = NULL;
    }
}

int cluster_replica_targets(const cluster *c, msg_peers *out, errbuf *err) {
    out->n = 0;
    out->addrs = calloc((size_t)c->total, sizeof *out->addrs);
    if (!out->addrs) return errf(err, "out of memory");
    for (int i = c->nodes; i < c->total; i++)
        if (c->fds[i] >= 0 && c->replica_ports[i] > 0)
            snprintf(out->addrs[out->n++], sizeof out->addrs[0], "%s:%d", c->hosts[i], c->replica_ports[i]);
    return 0;
}

int64_t cluster_memory_step(const cluster *c) {
    for (int i = 1; i < c->nodes; i++)
        if (c->memory_steps[i] != c->memory_steps[0]) return -1;
    return c->memory_steps[0];
}

void cluster_free(cluster *c) {
    if (!c) return;
    cluster_detach(c);
    for (int i = 0; c->fds && i < c->total; i++)
        if (c->fds[i] >= 0) close(c->fds[i]);
    if (c->file[0]) unlink(c->file);
    free(c->fds);
    free(c->hosts);
    free(c->replica_ports);
    free(c->links);
    free(c->table.addrs);
    free(c);
}

/* ---- the run's plan, before the loop ---- */

int cluster_send_plan(cluster *c, const msg_plan *plan, errbuf *err) {
    msg m = {.type = MSG_PLAN, .u.plan = *plan};
    for (int i = 1; i < c->nodes; i++)
        if (c->fds[i] >= 0 && msg_send(c->fds[i], &m, err)) return errprefix(err, "sending node %d the plan", i);
    return 0;
}

int cluster_recv_plan(cluster *c, msg_plan *plan, errbuf *err) {
    msg m;
    if (msg_recv(c->fds[0], &m, c->join_timeout_s * 1000, err))
        return errprefix(err, "waiting for the leader's plan (runtime.join_timeout_s = %d s)", c->join_timeout_s);
    int rc = 0;
    if (m.type == MSG_REFUSED) rc = errf(err, "the leader refused this node: %s", m.u.refused.reason);
    else if (m.type != MSG_PLAN) rc = errf(err, "the leader sent %s, not its PLAN", msg_type_name(m.type));
    else if (m.u.plan.error[0]) rc = errf(err, "the leader cannot run the job: %s", m.u.plan.error);
    else {
        *plan = m.u.plan;
        m.u.plan.replicas = (msg_peers){0}; /* the plan owns them now */
    }
    msg_free(&m);
    return rc;
}

/* ---- the links on the loop ---- */

static void send_to(node_link *l, const msg *m) {
    uint8_t *frame;
    size_t len;
    errbuf err;
    if (!l->bev || msg_encode(m, &frame, &len, &err)) return;
    bufferevent_write(l->bev, frame, len);
    free(frame);
}

static void to_followers(cluster *c, const msg *m) {
    for (int i = 1; i < c->nodes; i++) send_to(&c->links[i], m);
}

static void to_spares(cluster *c, const msg *m) {
    for (int i = c->nodes; c->links && i < c->total; i++) send_to(&c->links[i], m);
}

static node_link *to_leader(cluster *c) { return &c->links[0]; }

const json_t *cluster_leader_progress(const cluster *c) {
    return c && c->node != 0 && c->links ? c->links[0].progress : NULL;
}

/* Sends m (NULL: nothing more) on the link now, after whatever the bufferevent still holds
 * (a CKPT_DONE relayed just before), waiting up to 5 s for the socket: the loop that would
 * write them is ending, and a follower about to exit owes the leader its last reports. */
static void send_now(node_link *l, const msg *m) {
    if (!l->bev) return;
    if (m) send_to(l, m);
    struct evbuffer *out = bufferevent_get_output(l->bev);
    int fd = bufferevent_getfd(l->bev);
    double deadline = clock_now_s() + 5;
    evbuffer_unfreeze(out, 1); /* a bufferevent keeps the front of its output to itself */
    while (evbuffer_get_length(out) > 0 && clock_now_s() < deadline) {
        if (evbuffer_write(out, fd) >= 0) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        poll(&p, 1, clock_poll_ms(deadline));
    }
    evbuffer_freeze(out, 1);
}

/* A failure of the job seen by the cluster: the others are stopped (the leader tells them). */
static void stop_followers(cluster *c, const char *reason, int failed) {
    msg stop = {.type = MSG_STOP, .u.stop = {.failed = failed != 0, .permanent = failed && c->permanent}};
    snprintf(stop.u.stop.reason, sizeof stop.u.stop.reason, "%s", reason);
    to_followers(c, &stop);
    to_spares(c, &stop); /* a failure: they wait for the next attempt, where one may be needed */
}

/* A failure seen after the first is still told to the supervisor, which logs it beside the
 * job's reason: a node's own failure is often the consequence of another's (a worker noticing
 * a dead peer before its daemon hears of it), which must then still be named.  A failure no
 * restart cures, after one a restart would, is told to the followers again: every node must
 * take the same decision, to restart or not. */
static void cluster_stop(cluster *c, const char *reason, int permanent) {
    int tell = !c->failed || (permanent && !c->permanent);
    c->failed = 1;
    if (permanent) c->permanent = 1;
    if (tell && is_leader(c)) stop_followers(c, reason, 1);
    c->hooks.stop(c->hooks.arg, reason, 1, permanent);
}

static void close_link(node_link *l) {
    if (l->bev) bufferevent_free(l->bev);
    l->bev = NULL;
}

/* The leader's loop ends once every node has reported (or is gone). */
static void count_done(cluster *c, node_link *l) {
    if (l->done || is_spare_link(c, l->node)) return;
    l->done = 1;
    c->n_done++;
    if (c->finished && c->n_done == c->nodes) event_base_loopbreak(c->base);
}

/* Another node is gone (its link closed or silent): the job stops, naming it. */
static void lose(cluster *c, node_link *l, const char *what) {
    char why[MSG_TEXT_MAX + 3 * MSG_ADDR_MAX];
    close_link(l);
    l->lost = 1;
    if (is_leader(c) && is_spare_link(c, l->node)) { /* no rank of the job's: it is no spare any more */
        log_event(-1, "spare node %d (%s) %s: no longer a spare", slurm_node(c, l->node), c->hosts[l->node], what);
        return;
    }
    if (is_leader(c)) snprintf(why, sizeof why, "node %d (%s) %s", slurm_node(c, l->node), c->hosts[l->node], what);
    else snprintf(why, sizeof why, "the leader (node 0, %s) %s", c->hosts[0], what);
    cluster_stop(c, why, 0);
    if (is_leader(c)) count_done(c, l);
}

/* A CKPT_DONE a follower relays must be of one of its own ranks. */
static int owns_rank(const cluster *c, int node, int rank) {
    return rank >= node * c->workers && rank < (node + 1) * c->workers;
}

static void on_heartbeat_from(node_link *l, const msg_node_heartbeat *h) {
    l->heard = 1;
    snprintf(l->state, sizeof l->state, "%s", h->state);
    if (h->progress) {
        json_decref(l->progress);
        l->progress = json_incref(h->progress);
    }
    if (!h->ranks) return;
    json_decref(l->ranks);
    l->ranks = json_incref(h->ranks);
}

static void leader_on(cluster *c, node_link *l, const msg *m) {
    char why[MSG_TEXT_MAX + 64];
    if (is_spare_link(c, l->node)) {
        if (m->type == MSG_NODE_HEARTBEAT) l->heard = 1, strcpy(l->state, "spare");
        else lose(c, l, "sent a message a spare does not send");
        return;
    }
    switch (m->type) {
    case MSG_NODE_ADDRS:
        if (m->u.node_addrs.node != l->node || m->u.node_addrs.list.n != c->workers) break;
        for (int r = 0; r < c->workers; r++) strcpy(c->table.addrs[l->node * c->workers + r], m->u.node_addrs.list.addrs[r]);
        if (++c->n_addrs == c->nodes) {
            msg peers = {.type = MSG_PEERS, .u.peers = c->table};
            to_followers(c, &peers);
            c->hooks.peers(c->hooks.arg, &c->table);
        }
        return;
    case MSG_NODE_READY:
        if (++c->n_ready == c->nodes) {
            msg start = {.type = MSG_START};
            to_followers(c, &start);
            c->hooks.start(c->hooks.arg);
        }
        return;
    case MSG_NODE_HEARTBEAT:
        if (m->u.node_heartbeat.node != l->node) break;
        on_heartbeat_from(l, &m->u.node_heartbeat);
        return;
    case MSG_CKPT_DONE:
        if (!owns_rank(c, l->node, m->u.ckpt_done.rank)) break;
        c->hooks.ckpt_done(c->hooks.arg, &m->u.ckpt_done);
        return;
    case MSG_CKPT_REQUEST: c->hooks.ckpt_request(c->hooks.arg, &m->u.ckpt_request); return;
    case MSG_NODE_DONE:
        if (!m->u.node_done.ok && m->u.node_done.error[0]) {
            snprintf(why, sizeof why, "node %d (%s) failed: %s", slurm_node(c, l->node), c->hosts[l->node],
                     m->u.node_done.error);
            cluster_stop(c, why, m->u.node_done.permanent);
        }
        count_done(c, l);
        return;
    default: break;
    }
    snprintf(why, sizeof why, "node %d sent an unexpected %s message", slurm_node(c, l->node), msg_type_name(m->type));
    cluster_stop(c, why, 0);
}

static void follower_on(cluster *c, const msg *m) {
    char why[MSG_TEXT_MAX + 32];
    switch (m->type) {
    case MSG_PEERS: c->hooks.peers(c->hooks.arg, &m->u.peers); return;
    case MSG_NCCL_ID: c->hooks.nccl_id(c->hooks.arg, m); return;
    case MSG_START: c->hooks.start(c->hooks.arg); return;
    case MSG_NODE_HEARTBEAT: on_heartbeat_from(to_leader(c), &m->u.node_heartbeat); return;
    case MSG_CKPT_BEGIN:
    case MSG_CKPT_ABORT: c->hooks.to_workers(c->hooks.arg, m); return;
    case MSG_STOP:
        snprintf(why, sizeof why, "stopped by the leader: %s", m->u.stop.reason);
        c->leader_stopped = 1;
        if (m->u.stop.failed) c->failed = 1;
        if (m->u.stop.failed && m->u.stop.permanent) c->permanent = 1; /* told: not said back */
        c->hooks.stop(c->hooks.arg, why, m->u.stop.failed, m->u.stop.failed && m->u.stop.permanent);
        return;
    default: break;
    }
    snprintf(why, sizeof why, "the leader sent an unexpected %s message", msg_type_name(m->type));
    cluster_stop(c, why, 0);
}

static void on_link_readable(struct bufferevent *bev, void *arg) {
    node_link *l = arg;
    cluster *c = l->c;
    struct evbuffer *in = bufferevent_get_input(bev);
    unsigned char chunk[65536];
    errbuf err;
    int n, got;
    int bad = 0;
    l->last_seen = clock_now_s();
    while (!bad && (n = evbuffer_remove(in, chunk, sizeof chunk)) > 0)
        bad = msg_decoder_feed(&l->dec, chunk, (size_t)n, &err);
    msg_frame f;
    while (!bad && l->bev && (got = msg_decoder_next(&l->dec, &f, &err)) != 0) {
        msg m;
        bad = got < 0 || msg_decode(&f, &m, &err);
        if (got > 0) msg_frame_free(&f);
        if (bad) break;
        if (is_leader(c)) leader_on(c, l, &m);
        else follower_on(c, &m);
        msg_free(&m);
    }
    if (bad && l->bev) {
        char what[MSG_TEXT_MAX + 32];
        snprintf(what, sizeof what, "broke the protocol: %s", err.msg);
        lose(c, l, what);
    }
}

static void on_link_event(struct bufferevent *bev, short events, void *arg) {
    (void)bev;
    node_link *l = arg;
    cluster *c = l->c;
    if (!(events & (BEV_EVENT_EOF | BEV_EVENT_ERROR))) return;
    on_link_readable(l->bev, l);
    if (!l->bev) return;
    /* It had finished; or the leader had stopped this follower (the leader's run may end, and
     * close, before this node's workers have all exited: it counts a failed node done at its
     * report), or this follower had finished and the leader ended the job (a follower that
     * failed on its own hears of a leader that died meanwhile: that may be why); or a spare
     * moves on to the next attempt. */
    if (l->done || (!is_leader(c) && (c->leader_stopped || (c->finished && !c->failed))) ||
        (is_spare_link(c, l->node) && (c->finished || c->failed))) {
        close_link(l);
        return;
    }
    lose(c, l, "closed its connection (its daemon died?)");
}

/* Bytes waiting in the socket count as a sign of life: after a long stretch off the loop
 * (this daemon busy), the timer may run before the read callbacks. */
static int has_unread(node_link *l) {
    char byte;
    int fd = bufferevent_getfd(l->bev);
    return evbuffer_get_length(bufferevent_get_input(l->bev)) > 0 ||
           recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* Every heartbeat_s: this node's heartbeat to the other end(s), and each link's silence
 * judged: node_timeout_s once it has heartbeated, join_timeout_s before (it may still be
 * loading the model). */
static void on_heartbeat(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    cluster *c = arg;
    msg hb = {.type = MSG_NODE_HEARTBEAT, .u.node_heartbeat = {.node = c->node}};
    snprintf(hb.u.node_heartbeat.state, sizeof hb.u.node_heartbeat.state, "%s", c->hooks.state(c->hooks.arg));
    if (!is_leader(c)) hb.u.node_heartbeat.ranks = c->hooks.ranks(c->hooks.arg);
    else if (c->hooks.progress) hb.u.node_heartbeat.progress = c->hooks.progress(c->hooks.arg);
    if (is_leader(c)) to_followers(c, &hb), to_spares(c, &hb);
    else send_to(to_leader(c), &hb);
    json_decref(hb.u.node_heartbeat.ranks);
    json_decref(hb.u.node_heartbeat.progress);
    double now = clock_now_s();
    for (int i = 0; i < c->total; i++) {
        node_link *l = &c->links[i];
        if (!l->bev || l->done || i == c->node) continue;
        int limit = l->heard ? c->node_timeout_s : c->join_timeout_s;
        if (has_unread(l)) l->last_seen = now;
        if (now - l->last_seen <= limit) continue;
        char what[160];
        snprintf(what, sizeof what, "sent nothing for %.0f s (runtime.%s = %d s)", now - l->last_seen,
                 l->heard ? "node_timeout_s" : "join_timeout_s", limit);
        lose(c, l, what);
    }
}

int cluster_attach(cluster *c, struct event_base *base, const cluster_hooks *hooks, errbuf *err) {
    c->hooks = *hooks;
    c->base = base;
    c->links = calloc((size_t)c->total, sizeof *c->links);
    c->table.n = c->nodes * c->workers;
    c->table.addrs = calloc((size_t)c->table.n, sizeof *c->table.addrs);
    if (!c->links || !c->table.addrs) return errf(err, "out of memory");
    c->n_done = 1; /* this node's own report is cluster_done */
    for (int i = 0; i < c->total; i++) {
        node_link *l = &c->links[i];
        *l = (node_link){.c = c, .node = i, .last_seen = clock_now_s()};
        msg_decoder_init(&l->dec);
        if (c->fds[i] < 0) continue;
        evutil_make_socket_nonblocking(c->fds[i]);
        l->bev = bufferevent_socket_new(base, c->fds[i], BEV_OPT_CLOSE_ON_FREE);
        if (!l->bev) return errf(err, "node %d: cannot create its connection", i);
        c->fds[i] = -1; /* the bufferevent owns it */
        l->joined = 1;
        bufferevent_setcb(l->bev, on_link_readable, NULL, on_link_event, l);
        if (bufferevent_enable(l->bev, EV_READ | EV_WRITE)) return errf(err, "node %d: cannot read its connection", i);
    }
    if (c->total == 1) return 0;
    struct timeval every = {c->heartbeat_s, 0};
    c->heartbeat = event_new(base, -1, EV_PERSIST, on_heartbeat, c);
    if (!c->heartbeat || event_add(c->heartbeat, &every))
        return errf(err, "cannot start the heartbeats between nodes");
    return 0;
}

void cluster_addrs(cluster *c, const msg_peers *local) {
    if (!is_leader(c)) {
        msg m = {.type = MSG_NODE_ADDRS, .u.node_addrs = {.node = c->node, .list = *local}};
        send_to(to_leader(c), &m);
        return;
    }
    msg m = {.type = MSG_NODE_ADDRS, .u.node_addrs = {.node = 0, .list = *local}};
    leader_on(c, &c->links[0], &m);
}

void cluster_relay_nccl_id(cluster *c, const msg *id) {
    to_followers(c, id);
    c->hooks.nccl_id(c->hooks.arg, id);
}

void cluster_ready(cluster *c) {
    if (!is_leader(c)) {
        msg m = {.type = MSG_NODE_READY, .u.node_ready = {.node = c->node}};
        send_to(to_leader(c), &m);
        return;
    }
    msg m = {.type = MSG_NODE_READY, .u.node_ready = {.node = 0}};
    leader_on(c, &c->links[0], &m);
}

void cluster_to_leader(cluster *c, const msg *m) { send_to(to_leader(c), m); }

void cluster_to_followers(cluster *c, const msg *m) { to_followers(c, m); }

void cluster_to_rank(cluster *c, int rank, const msg *m) {
    int node = rank / c->workers;
    if (node > 0 && node < c->nodes) send_to(&c->links[node], m);
}

void cluster_stop_all(cluster *c, const char *reason) {
    if (is_leader(c) && !c->failed) stop_followers(c, reason, 0);
}

void cluster_fail(cluster *c, const char *reason, int permanent) {
    if (c->failed && (!permanent || c->permanent)) return;
    c->failed = 1;
    if (permanent) c->permanent = 1;
    if (is_leader(c)) {
        stop_followers(c, reason, 1);
        return;
    }
    /* a second NODE_DONE, after a first that a restart could cure, makes it permanent */
    msg m = {.type = MSG_NODE_DONE, .u.node_done = {.node = c->node, .ok = false, .permanent = permanent != 0}};
    c->told_leader = 1;
    snprintf(m.u.node_done.error, sizeof m.u.node_done.error, "%s", reason);
    send_to(to_leader(c), &m);
}

void cluster_lost(const cluster *c, msg_nodes *out) {
    out->n = 0;
    for (int i = 0; c->links && i < c->nodes; i++)
        if (c->links[i].lost) out->id[out->n++] = slurm_node(c, i);
}

void cluster_spares_alive(const cluster *c, msg_nodes *out) {
    out->n = 0;
    for (int i = c->nodes; c->links && i < c->total; i++)
        if (c->links[i].joined && !c->links[i].lost) out->id[out->n++] = slurm_node(c, i);
}

int cluster_done(cluster *c, int failed) {
    c->finished = 1;
    if (is_leader(c) && !c->failed) { /* the spares: the run ended (a failure told them before) */
        msg stop = {.type = MSG_STOP, .u.stop = {.failed = failed != 0}};
        snprintf(stop.u.stop.reason, sizeof stop.u.stop.reason, "%s", failed ? "the run failed" : "the run ended");
        for (int i = c->nodes; i < c->total; i++) send_now(&c->links[i], &stop);
    }
    if (!is_leader(c)) {
        /* A failure of its own was told before (cluster_fail); one the leader told it is
         * answered with an empty error: done, not lost (the leader re-plans without the lost). */
        msg m = {.type = MSG_NODE_DONE, .u.node_done = {.node = c->node, .ok = !c->failed}};
        send_now(to_leader(c), c->told_leader ? NULL : &m);
        return 1;
    }
    return c->n_done == c->nodes;
}

/* ---- status ---- */

json_t *cluster_status(const cluster *c, json_t *local_ranks, const char *local_state) {
    json_t *nodes = json_array();
    double now = clock_now_s();
    for (int i = 0; i < (is_leader(c) ? c->total : c->nodes); i++) {
        if (!is_leader(c) && i != 0 && i != c->node) continue;
        const node_link *l = c->links ? &c->links[i] : NULL;
        int self = i == c->node;
        const char *role = i == 0 ? "leader" : is_spare_link(c, i) ? "spare" : "follower";
        json_t *row = json_pack("{s:i, s:i, s:s, s:s, s:b}", "node", i, "slurm_node", slurm_node(c, i), "host",
                                c->hosts[i], "role", role, "connected", self || (l && l->bev));
        if (!row) continue;
        json_object_set_new(row, "state", json_string(self ? local_state : l && l->state[0] ? l->state : "unknown"));
        json_object_set_new(row, "last_heard_s", self || !l ? json_null() : json_real(now - l->last_seen));
        json_t *ranks = self ? json_incref(local_ranks) : l && l->ranks ? json_incref(l->ranks) : json_array();
        if (is_leader(c) || self) json_object_set_new(row, "ranks", ranks);
        else json_decref(ranks);
        json_array_append_new(nodes, row);
    }
    return nodes;
}
