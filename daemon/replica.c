/* replica: in-memory checkpoint images copied to the spare nodes.  See replica.h. */
#include "daemon/replica.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/clock.h"
#include "daemon/host_memory.h"
#include "daemon/log.h"
#include "proto/ckpt.h"
#include "proto/replica.h"

#define CHUNK ((size_t)4 << 20)

static int send_full(int fd, const void *p, size_t n) {
    const char *b = p;
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k, n -= (size_t)k;
    }
    return 0;
}

static int recv_full(int fd, void *p, size_t n) {
    char *b = p;
    while (n) {
        ssize_t k = recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k, n -= (size_t)k;
    }
    return 0;
}

/* The step an image holds sealed, -1 for none. */
static int64_t image_step(int fd) {
    ckpt_file_header h;
    errbuf ignored;
    if (ckpt_read_header(&h, fd, "image", &ignored)) return -1;
    int64_t step = (int64_t)h.step;
    ckpt_file_header_free(&h);
    return step;
}

/* ---- the sink, on a spare ---- */

typedef struct sink_image {
    int fd[2];
    int64_t step[2]; /* sealed and whole; -1: none (or being written) */
    int busy[2];     /* a stream is writing it */
} sink_image;

typedef struct sink_conn {
    struct replica_sink *s;
    int fd;
    pthread_t thread;
    int used, finished;
} sink_conn;

struct replica_sink {
    int places, port, lfd, quit;
    pthread_t acceptor;
    pthread_mutex_t lock;
    unsigned char secret[MSG_SECRET_BYTES];
    int has_secret;
    int nodes;          /* of the table; 0 until the first stream */
    sink_image *images; /* [nodes * places] */
    int slots;          /* 2 or 1; 0 when none fit (decided at the first stream) */
    int refused;        /* the no-room line is logged */
    sink_conn conns[REPLICA_MAX_CONNECTIONS];
};

static void free_table(replica_sink *s) {
    for (int i = 0; s->images && i < s->nodes * s->places; i++)
        for (int j = 0; j < 2; j++)
            if (s->images[i].fd[j] >= 0) close(s->images[i].fd[j]);
    free(s->images);
    s->images = NULL;
    s->nodes = 0;
}

/* Under the lock: the image of (node, place) a stream of h goes into (marked unsealed), -1
 * when none can (why logged once). */
static int take_image(replica_sink *s, const replica_header *h, int *slot) {
    if (h->places != (uint32_t)s->places || (s->nodes && (int)h->nodes != s->nodes)) return -1;
    if (!s->nodes) { /* the table, at the first stream: fixed for the launch */
        s->images = calloc(h->nodes * (size_t)s->places, sizeof *s->images);
        if (!s->images) return -1;
        s->nodes = (int)h->nodes;
        for (int i = 0; i < s->nodes * s->places; i++)
            s->images[i] = (sink_image){.fd = {-1, -1}, .step = {-1, -1}};
        uint64_t all = h->bytes * h->nodes * (uint64_t)s->places, have = 0;
        const char *source;
        errbuf err;
        if (host_memory_available(&have, &source, &err)) have = 0;
        s->slots = memory_ckpt_images_fit(all, have);
        log_event(-1, "replicas of the in-memory checkpoints: %d node(s) x %d place(s) x %d image(s) of %.3f GiB "
                      "(%.1f GiB free: %s)", s->nodes, s->places, s->slots, (double)h->bytes / (1ull << 30),
                  (double)have / (1ull << 30), source);
    }
    if (s->slots == 0) return -1;
    sink_image *im = &s->images[h->node * (uint32_t)s->places + h->place];
    int j = s->slots == 2 && !im->busy[1] && (im->busy[0] || im->step[1] < im->step[0]);
    if (im->busy[j]) return -1; /* the node's earlier connection still writes it */
    if (im->fd[j] < 0 && (im->fd[j] = memfd_create("fsdpd-replica", MFD_CLOEXEC)) < 0) return -1;
    im->step[j] = -1;
    im->busy[j] = 1;
    *slot = j;
    return im->fd[j];
}

/* One image of the stream into fd (h->bytes), then its trailer: 1 when whole with its step,
 * 0 when not, -1 when the stream broke. */
static int receive_image(int conn, int fd, const replica_header *h, void *chunk) {
    int ok = ftruncate(fd, (off_t)h->bytes) == 0;
    for (uint64_t at = 0; at < h->bytes;) {
        size_t n = h->bytes - at < CHUNK ? (size_t)(h->bytes - at) : CHUNK;
        if (recv_full(conn, chunk, n)) return -1;
        if (ok && pwrite(fd, chunk, n, (off_t)at) != (ssize_t)n) ok = 0;
        at += n;
    }
    uint8_t trailer[REPLICA_TRAILER];
    errbuf err;
    if (recv_full(conn, trailer, sizeof trailer)) return -1;
    int done = replica_trailer(trailer, &err);
    if (done < 0) return -1;
    return ok && done && image_step(fd) == h->step;
}

/* Reads and drops one image and its trailer (no room for it). */
static int drop_image(int conn, const replica_header *h, void *chunk) {
    for (uint64_t at = 0; at < h->bytes;) {
        size_t n = h->bytes - at < CHUNK ? (size_t)(h->bytes - at) : CHUNK;
        if (recv_full(conn, chunk, n)) return -1;
        at += n;
    }
    uint8_t trailer[REPLICA_TRAILER];
    return recv_full(conn, trailer, sizeof trailer);
}

static void *serve(void *arg) {
    sink_conn *c = arg;
    replica_sink *s = c->s;
    unsigned char secret[MSG_SECRET_BYTES];
    errbuf err;
    pthread_mutex_lock(&s->lock);
    int known = s->has_secret;
    memcpy(secret, s->secret, sizeof secret);
    pthread_mutex_unlock(&s->lock);
    void *chunk = malloc(CHUNK);
    int rc = chunk && known ? 0 : -1;
    if (rc == 0 && auth_handshake(c->fd, secret, sizeof secret, 0, REPLICA_AUTH_CONTEXT,
                                  clock_now_s() + REPLICA_HANDSHAKE_S, &err))
        rc = -1;
    while (rc == 0) {
        uint8_t raw[REPLICA_HEADER];
        replica_header h;
        if (recv_full(c->fd, raw, sizeof raw)) break;
        if (replica_decode(&h, raw, &err)) {
            log_event(-1, "a replica stream refused: %s", err.msg);
            break;
        }
        int slot = 0;
        pthread_mutex_lock(&s->lock);
        int fd = take_image(s, &h, &slot);
        int log_refusal = fd < 0 && !s->refused;
        if (log_refusal) s->refused = 1;
        pthread_mutex_unlock(&s->lock);
        if (log_refusal)
            log_event(-1, "replicas of node %u's images dropped: no room for them on this spare (or %u places, not %d)",
                      h.node, h.places, s->places);
        if (fd < 0) {
            if (drop_image(c->fd, &h, chunk)) break;
            continue;
        }
        int whole = receive_image(c->fd, fd, &h, chunk);
        pthread_mutex_lock(&s->lock);
        sink_image *im = &s->images[h.node * (uint32_t)s->places + h.place];
        im->busy[slot] = 0;
        if (whole > 0) im->step[slot] = h.step;
        pthread_mutex_unlock(&s->lock);
        if (whole < 0) break;
    }
    free(chunk);
    close(c->fd);
    pthread_mutex_lock(&s->lock);
    c->finished = 1;
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Under the lock: joins the connections that ended; a free entry, or NULL. */
static sink_conn *free_conn(replica_sink *s) {
    sink_conn *free_one = NULL;
    for (int i = 0; i < REPLICA_MAX_CONNECTIONS; i++) {
        sink_conn *c = &s->conns[i];
        if (c->used && c->finished) {
            pthread_join(c->thread, NULL);
            c->used = 0;
        }
        if (!c->used && !free_one) free_one = c;
    }
    return free_one;
}

static void *accept_loop(void *arg) {
    replica_sink *s = arg;
    while (!__atomic_load_n(&s->quit, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        pthread_mutex_lock(&s->lock);
        sink_conn *c = free_conn(s);
        if (c) *c = (sink_conn){.s = s, .fd = fd, .used = 1};
        if (c && pthread_create(&c->thread, NULL, serve, c) != 0) c->used = 0, c = NULL;
        pthread_mutex_unlock(&s->lock);
        if (!c) close(fd);
    }
    return NULL;
}

int replica_sink_open(replica_sink **out, int places, errbuf *err) {
    replica_sink *s = calloc(1, sizeof *s);
    if (!s) return errf(err, "out of memory");
    s->places = places;
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(s->lfd, 64) != 0 ||
        getsockname(s->lfd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        if (s->lfd >= 0) close(s->lfd);
        free(s);
        return errf(err, "the replicas' listener: %s", strerror(e));
    }
    s->port = ntohs(a.sin_port);
    if (pthread_mutex_init(&s->lock, NULL) != 0 || pthread_create(&s->acceptor, NULL, accept_loop, s) != 0) {
        close(s->lfd);
        free(s);
        return errf(err, "the replicas' listener: cannot start its thread");
    }
    *out = s;
    return 0;
}

int replica_sink_port(const replica_sink *s) { return s->port; }

void replica_sink_secret(replica_sink *s, const unsigned char *secret, size_t n) {
    pthread_mutex_lock(&s->lock);
    memcpy(s->secret, secret, n < sizeof s->secret ? n : sizeof s->secret);
    s->has_secret = 1;
    pthread_mutex_unlock(&s->lock);
}

/* Stops accepting and ends every connection (their threads joined). */
static void stop_sink(replica_sink *s) {
    if (__atomic_exchange_n(&s->quit, 1, __ATOMIC_ACQ_REL)) return;
    pthread_join(s->acceptor, NULL);
    close(s->lfd);
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < REPLICA_MAX_CONNECTIONS; i++)
        if (s->conns[i].used && !s->conns[i].finished) shutdown(s->conns[i].fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < REPLICA_MAX_CONNECTIONS; i++)
        if (s->conns[i].used) pthread_join(s->conns[i].thread, NULL);
    memset(s->conns, 0, sizeof s->conns);
}

int64_t replica_sink_step(replica_sink *s, int node, int place) {
    int64_t step = -1;
    pthread_mutex_lock(&s->lock);
    if (node >= 0 && node < s->nodes && place >= 0 && place < s->places) {
        const sink_image *im = &s->images[node * s->places + place];
        step = im->step[0] > im->step[1] ? im->step[0] : im->step[1];
    }
    pthread_mutex_unlock(&s->lock);
    return step;
}

int replica_sink_adopt(replica_sink *s, int node, memory_images *im, errbuf *err) {
    stop_sink(s);
    int whole = 0;
    for (int k = 0; node >= 0 && node < s->nodes && k < s->places; k++)
        for (int j = 0; j < 2; j++) whole += s->images[node * s->places + k].step[j] >= 0;
    if (!whole || !im->fd || im->workers != s->places)
        return errf(err, "this spare holds no copy of node %d's in-memory checkpoint", node);
    for (int k = 0; k < s->places; k++) {
        sink_image *from = &s->images[node * s->places + k];
        for (int j = 0; j < 2; j++) {
            if (from->fd[j] < 0) continue;
            close(im->fd[2 * k + j]);
            im->fd[2 * k + j] = from->fd[j];
            from->fd[j] = -1;
        }
    }
    log_event(-1, "this spare's copy of node %d's in-memory checkpoint images becomes its own", node);
    return 0;
}

void replica_sink_close(replica_sink *s) {
    if (!s) return;
    stop_sink(s);
    free_table(s);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---- the source, on an active node ---- */

struct replica_source {
    const memory_images *im;
    int node, nodes, files;
    int n_targets;
    char (*targets)[MSG_ADDR_MAX];
    int *fds;     /* [n_targets]: connected and authenticated, -1 for not */
    int *warned;  /* [n_targets]: a failure logged */
    unsigned char secret[MSG_SECRET_BYTES];
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int64_t want, sent;
    int quit;
};

/* The thread sets fds[t] under the lock, so that replica_source_stop's shutdown never meets
 * a descriptor being closed. */
static void set_fd(replica_source *s, int t, int fd) {
    pthread_mutex_lock(&s->lock);
    if (s->fds[t] >= 0) close(s->fds[t]);
    s->fds[t] = fd;
    pthread_mutex_unlock(&s->lock);
}

/* fds[t]: a connection to target t that proved the secret (0), or -1 with why.  The socket is
 * in fds[t] from its start, so that replica_source_stop ends a connect or a handshake too. */
static int connect_target(replica_source *s, int t, errbuf *err) {
    char host[MSG_ADDR_MAX];
    snprintf(host, sizeof host, "%s", s->targets[t]);
    char *colon = strrchr(host, ':');
    struct sockaddr_in a = {.sin_family = AF_INET};
    if (!colon) return errf(err, "%s: no port", s->targets[t]);
    *colon = '\0';
    a.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return errf(err, "%s: not an IPv4 address", s->targets[t]);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errf(err, "socket: %s", strerror(errno));
    set_fd(s, t, fd);
    /* A spare that stops reading is given up after 30 s; one that cannot be reached at once. */
    struct timeval tv = {.tv_sec = 30}, connect_tv = {.tv_sec = (time_t)REPLICA_HANDSHAKE_S};
    int rc = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &connect_tv, sizeof connect_tv) == 0 ? 0
             : errf(err, "setsockopt: %s", strerror(errno));
    if (rc == 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) rc = errf(err, "connect: %s", strerror(errno));
    if (rc == 0) rc = auth_handshake(fd, s->secret, sizeof s->secret, 1, REPLICA_AUTH_CONTEXT,
                                     clock_now_s() + REPLICA_HANDSHAKE_S, err);
    if (rc == 0 && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
        rc = errf(err, "setsockopt: %s", strerror(errno));
    if (rc) set_fd(s, t, -1);
    return rc;
}

/* Place k's image that holds `step` to fd: 0, or -1 when the connection broke (1: no image of
 * the step, nothing sent). */
static int send_image(replica_source *s, int fd, int k, int64_t step, void *chunk) {
    int img = -1;
    for (int j = 0; j < 2 && img < 0; j++)
        if (image_step(s->im->fd[2 * k + j]) == step) img = s->im->fd[2 * k + j];
    if (img < 0) return 1;
    ckpt_file_header ch;
    errbuf err;
    if (ckpt_read_header(&ch, img, "image", &err)) return 1;
    replica_header h = {.node = (uint32_t)s->node, .nodes = (uint32_t)s->nodes, .place = (uint32_t)k,
                        .places = (uint32_t)s->im->workers, .step = step, .bytes = ch.file_bytes};
    ckpt_file_header_free(&ch);
    uint8_t raw[REPLICA_HEADER];
    replica_encode(&h, raw);
    if (send_full(fd, raw, sizeof raw)) return -1;
    int readable = 1;
    for (uint64_t at = 0; at < h.bytes;) {
        size_t n = h.bytes - at < CHUNK ? (size_t)(h.bytes - at) : CHUNK;
        if (readable && pread(img, chunk, n, (off_t)at) != (ssize_t)n) readable = 0;
        if (send_full(fd, chunk, n)) return -1;
        at += n;
    }
    /* Still the step once read whole: its rank began no other save meanwhile (a save breaks the
     * seal before it writes, proto/ckpt.h). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int whole = readable && image_step(img) == step;
    return send_full(fd, whole ? REPLICA_DONE : REPLICA_TORN, REPLICA_TRAILER);
}

static void send_step(replica_source *s, int64_t step, void *chunk) {
    for (int t = 0; t < s->n_targets; t++) {
        errbuf err = {""};
        if (s->fds[t] < 0 && connect_target(s, t, &err)) {
            if (!s->warned[t]++)
                log_event(-1, "cannot copy the in-memory checkpoint to spare %s (tried again at each step): %s",
                          s->targets[t], err.msg);
            continue;
        }
        for (int k = 0; k < s->files; k++) {
            if (send_image(s, s->fds[t], k, step, chunk) >= 0) continue;
            if (!s->warned[t]++) log_event(-1, "copying the in-memory checkpoint to spare %s: the connection broke", s->targets[t]);
            set_fd(s, t, -1);
            break;
        }
    }
}

static void *source_main(void *arg) {
    replica_source *s = arg;
    void *chunk = malloc(CHUNK);
    pthread_mutex_lock(&s->lock);
    while (chunk) {
        while (!s->quit && s->want <= s->sent) pthread_cond_wait(&s->cond, &s->lock);
        if (s->quit) break;
        int64_t step = s->want;
        pthread_mutex_unlock(&s->lock);
        send_step(s, step, chunk);
        pthread_mutex_lock(&s->lock);
        s->sent = step;
    }
    pthread_mutex_unlock(&s->lock);
    free(chunk);
    return NULL;
}

int replica_source_start(replica_source **out, const memory_images *im, int node, int nodes, int files,
                         const msg_peers *targets, const unsigned char *secret, size_t secret_len, errbuf *err) {
    *out = NULL;
    if (!im->fd || targets->n == 0 || files <= 0) return 0;
    replica_source *s = calloc(1, sizeof *s);
    if (s) s->targets = calloc((size_t)targets->n, sizeof *s->targets);
    if (s && s->targets) s->fds = malloc((size_t)targets->n * sizeof *s->fds);
    if (s && s->fds) s->warned = calloc((size_t)targets->n, sizeof *s->warned);
    if (!s || !s->warned) {
        if (s) free(s->targets), free(s->fds);
        free(s);
        return errf(err, "out of memory");
    }
    int *fds = s->fds, *warned = s->warned;
    char(*names)[MSG_ADDR_MAX] = s->targets;
    *s = (replica_source){.im = im, .node = node, .nodes = nodes, .files = files, .n_targets = targets->n,
                          .targets = names, .fds = fds, .warned = warned, .want = -1, .sent = -1};
    memcpy(s->targets, targets->addrs, (size_t)targets->n * sizeof *s->targets);
    memcpy(s->secret, secret, secret_len < sizeof s->secret ? secret_len : sizeof s->secret);
    for (int t = 0; t < s->n_targets; t++) s->fds[t] = -1;
    if (pthread_mutex_init(&s->lock, NULL) || pthread_cond_init(&s->cond, NULL) ||
        pthread_create(&s->thread, NULL, source_main, s)) {
        free(s->targets), free(s->fds), free(s->warned), free(s);
        return errf(err, "the replicas' sender: cannot start its thread");
    }
    *out = s;
    return 0;
}

void replica_source_push(replica_source *s, int64_t step) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    if (step > s->want) s->want = step;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

void replica_source_stop(replica_source *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->quit = 1;
    pthread_cond_signal(&s->cond);
    for (int t = 0; t < s->n_targets; t++)
        if (s->fds[t] >= 0) shutdown(s->fds[t], SHUT_RDWR); /* a send in flight returns */
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    for (int t = 0; t < s->n_targets; t++)
        if (s->fds[t] >= 0) close(s->fds[t]);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s->targets), free(s->fds), free(s->warned);
    free(s);
}
