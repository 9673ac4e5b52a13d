/* comm_tcp: the CPU backend of comm.h -- ring collectives over TCP.
 *
 * Each rank holds two connections: one it made to rank+1 (it only sends on it) and one it
 * accepted from rank-1 (it only receives on it).  A ring step sends one chunk forward while
 * receiving another from behind, both at once on non-blocking sockets driven by poll(), so
 * big chunks never deadlock and nothing waits past the collective's deadline.  Data travels
 * in the hosts' native byte order (every host of a job is little-endian).
 *
 *   all_gather      W-1 steps, each rank passing on the chunk it got in the previous one
 *   reduce_scatter  W-1 steps, each rank adding its values to the partial sum it received
 *                   (fp32 on the wire, so bf16 is rounded once); chunk i is always summed
 *                   in the order x[i+1] + x[i+2] + ... + x[i]: same bits on every run
 *   all_reduce      reduce_scatter on ceil(n/W) chunks, then all_gather
 *   broadcast       pipelined along the ring from the root
 *   barrier         a 1-byte all_gather */
#include "base/bf16.h"
#include "base/bytes.h"
#include "worker/comm.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/clock.h"
#include "worker/comm_backend.h"

#define XFER_MAX ((size_t)4 << 20) /* bytes per send()/recv() call */
#define MAX_PENDING 8              /* accepted connections still owing their handshake */

typedef struct tcp_comm {
    comm base;
    int next_fd; /* to rank+1: we only send on it */
    int prev_fd; /* from rank-1: we only receive on it */
} tcp_comm;

static int ring_next(const comm *c) { return (c->rank + 1) % c->world; }
static int ring_prev(const comm *c) { return (c->rank + c->world - 1) % c->world; }
static int ring_mod(const comm *c, int i) { return ((i % c->world) + c->world) % c->world; }

static int set_nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- addresses and the listener -------------------------------------------------------- */

/* "host:port", or "[host]:port" for IPv6, numeric. */
static int format_addr(const struct sockaddr *sa, socklen_t len, char *out, size_t outsz,
                       errbuf *err) {
    char host[NI_MAXHOST], port[NI_MAXSERV];
    int rc = getnameinfo(sa, len, host, sizeof host, port, sizeof port,
                         NI_NUMERICHOST | NI_NUMERICSERV);
    if (rc) return errf(err, "getnameinfo: %s", gai_strerror(rc));
    int n = sa->sa_family == AF_INET6 ? snprintf(out, outsz, "[%s]:%s", host, port)
                                      : snprintf(out, outsz, "%s:%s", host, port);
    if (n < 0 || (size_t)n >= outsz) return errf(err, "address %s:%s is too long", host, port);
    return 0;
}

/* Splits "host:port" or "[v6]:port". */
static int split_addr(const char *addr, char *host, size_t hostsz, char *port, size_t portsz) {
    const char *h = addr, *colon;
    size_t hlen;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':') return -1;
        h = addr + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon) return -1;
        hlen = (size_t)(colon - addr);
    }
    size_t plen = strlen(colon + 1);
    if (hlen == 0 || hlen >= hostsz || plen == 0 || plen >= portsz) return -1;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    memcpy(port, colon + 1, plen + 1);
    return 0;
}

static int is_wildcard(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET)
        return ((const struct sockaddr_in *)ss)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (ss->ss_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)ss)->sin6_addr);
    return 0;
}

/* Publishes the listener: checks it is not a wildcard, fills l->addr. */
static int describe_listener(comm_listener *l, const char *bind_host, errbuf *err) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(l->fd, (struct sockaddr *)&ss, &len))
        return errf(err, "getsockname: %s", strerror(errno));
    if (is_wildcard(&ss))
        return errf(err, "%s is a wildcard address; bind the address the peers should connect to",
                    bind_host);
    return format_addr((const struct sockaddr *)&ss, len, l->addr, sizeof l->addr, err);
}

int comm_tcp_listen(comm_listener *l, const char *bind_host, errbuf *err) {
    l->fd = -1;
    l->addr[0] = '\0';
    if (!bind_host || !*bind_host) return errf(err, "comm_tcp_listen: no bind address given");
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(bind_host, "0", &hints, &res);
    if (rc) return errf(err, "comm_tcp_listen: %s: %s", bind_host, gai_strerror(rc));
    int saved = 0;
    for (struct addrinfo *ai = res; ai && l->fd < 0; ai = ai->ai_next) {
        l->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                       ai->ai_protocol);
        if (l->fd < 0) {
            saved = errno;
        } else if (bind(l->fd, ai->ai_addr, ai->ai_addrlen) || listen(l->fd, 64)) {
            saved = errno;
            close(l->fd);
            l->fd = -1;
        }
    }
    freeaddrinfo(res);
    if (l->fd < 0)
        return errf(err, "comm_tcp_listen: cannot listen on %s: %s", bind_host, strerror(saved));
    if (describe_listener(l, bind_host, err)) {
        comm_listener_close(l);
        return errprefix(err, "comm_tcp_listen");
    }
    return 0;
}

void comm_listener_close(comm_listener *l) {
    if (!l || l->fd < 0) return;
    close(l->fd);
    l->fd = -1;
}

/* ---- handshake ------------------------------------------------------------------------- */

/* A connection first proves the job secret both ways (base/auth.h: challenge and response,
 * the connecting rank initiates; the secret never travels), then the connecting rank sends
 * HELLO and the accepting rank answers ACK, fixed size, big-endian:
 * magic[8] kind status from to world.  A connection that fails either is dropped. */
#define COMM_AUTH_CONTEXT "fsdp-comm ring"
enum { HS_HELLO = 1, HS_ACK = 2 };
enum { HS_OK, HS_BAD_WORLD, HS_BAD_RANK, HS_DUPLICATE };
#define HS_SIZE (8 + 5 * 4)
static const unsigned char hs_magic[8] = {'F', 'S', 'D', 'P', 'C', 'O', 'M', '2'};

typedef struct handshake {
    uint32_t kind, status, from, to, world;
} handshake;

static void hs_encode(const handshake *h, unsigned char *out) {
    memcpy(out, hs_magic, 8);
    le_put_u32(out + 8, h->kind);
    le_put_u32(out + 12, h->status);
    le_put_u32(out + 16, h->from);
    le_put_u32(out + 20, h->to);
    le_put_u32(out + 24, h->world);
}

static int hs_decode(handshake *h, const unsigned char *in, uint32_t kind) {
    if (memcmp(in, hs_magic, 8) != 0 || le_get_u32(in + 8) != kind) return -1;
    h->kind = kind;
    h->status = le_get_u32(in + 12);
    h->from = le_get_u32(in + 16);
    h->to = le_get_u32(in + 20);
    h->world = le_get_u32(in + 24);
    return 0;
}

static const char *hs_status_name(uint32_t status) {
    switch (status) {
    case HS_BAD_WORLD: return "different world size";
    case HS_BAD_RANK: return "unexpected rank";
    case HS_DUPLICATE: return "that rank is already connected";
    }
    return "unknown reason";
}

static void hs_make(handshake *h, uint32_t kind, uint32_t status, int from, int to, int world) {
    h->kind = kind;
    h->status = status;
    h->from = (uint32_t)from;
    h->to = (uint32_t)to;
    h->world = (uint32_t)world;
}

/* Sends all of a small message by the deadline; -1 with errno. */
static int send_exact(int fd, const void *buf, size_t len, double deadline) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = send(fd, (const char *)buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            done += (size_t)n;
            continue;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        int ms = clock_poll_ms(deadline);
        if (ms == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, ms) < 0 && errno != EINTR) return -1;
    }
    return 0;
}

/* Waits for a non-blocking connect to finish; -1 with errno. */
static int wait_connected(int fd, double deadline) {
    struct pollfd p = {fd, POLLOUT, 0};
    for (;;) {
        int ms = clock_poll_ms(deadline);
        if (ms == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        int rc = poll(&p, 1, ms);
        if (rc > 0) break;
        if (rc < 0 && errno != EINTR) return -1;
    }
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len)) return -1;
    if (soerr) {
        errno = soerr;
        return -1;
    }
    return 0;
}

/* One connection attempt; the connected fd, or -1 with errno. */
static int try_connect(const struct addrinfo *ai, double deadline) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) return -1;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    if ((errno == EINPROGRESS || errno == EINTR) && wait_connected(fd, deadline) == 0) return fd;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

/* Connects to the rank at addr, retrying (the peer may not listen yet, or be busy) until
 * the deadline.  Returns the fd or -1. */
static int connect_until(const char *addr, int peer, double deadline, double timeout_s,
                         errbuf *err) {
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (split_addr(addr, host, sizeof host, port, sizeof port))
        return errf(err, "rank %d's address \"%s\" is not host:port", peer, addr);
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) return errf(err, "rank %d at %s: %s", peer, addr, gai_strerror(rc));
    int fd = -1, last = ETIMEDOUT;
    double backoff = 0.02;
    for (;;) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            fd = try_connect(ai, deadline);
            if (fd < 0) last = errno;
        }
        if (fd >= 0 || clock_now_s() + backoff >= deadline) break;
        clock_sleep_s(backoff);
        backoff = fmin(2 * backoff, 0.5);
    }
    freeaddrinfo(res);
    if (fd < 0)
        return errf(err, "could not connect to rank %d at %s within %g s: %s", peer, addr,
                    timeout_s, strerror(last));
    if (set_nodelay(fd)) {
        int saved = errno;
        close(fd);
        return errf(err, "rank %d at %s: TCP_NODELAY: %s", peer, addr, strerror(saved));
    }
    return fd;
}

/* An accepted connection that has not finished its authentication and HELLO yet. */
typedef struct pending {
    int fd;
    auth_session auth;
    int authed; /* the secret is proved both ways */
    size_t got; /* bytes of its HELLO */
    unsigned char buf[HS_SIZE];
} pending;

/* Our connection to rank+1 while its handshake is under way. */
typedef struct next_link {
    auth_session auth;
    int authed; /* the secret is proved both ways and our HELLO is sent */
    size_t got; /* bytes of its ACK */
    unsigned char ack[HS_SIZE];
} next_link;

static uint32_t check_hello(const tcp_comm *t, const handshake *h) {
    if (h->world != (uint32_t)t->base.world) return HS_BAD_WORLD;
    if (h->to != (uint32_t)t->base.rank || h->from != (uint32_t)ring_prev(&t->base))
        return HS_BAD_RANK;
    if (t->prev_fd >= 0) return HS_DUPLICATE;
    return HS_OK;
}

static void drop(pending *p) {
    close(p->fd);
    p->fd = -1;
}

/* Advances an accepted connection: authentication, then its HELLO; once that is complete,
 * adopts it as the connection from rank-1 or turns it away (p->fd = -1 either way).  A
 * stranger, a peer without the secret or one not speaking our protocol is dropped without
 * a word (the library does not print; the connecting side reports its own refusal). */
static int read_hello(tcp_comm *t, pending *p, double deadline, errbuf *err) {
    if (!p->authed) {
        errbuf ignored;
        int rc = auth_step(&p->auth, p->fd, &ignored);
        if (rc < 0) drop(p);
        if (rc <= 0) return 0;
        p->authed = 1; /* its HELLO may be here already */
    }
    ssize_t n = recv(p->fd, p->buf + p->got, HS_SIZE - p->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n > 0) p->got += (size_t)n;
    handshake h;
    if (n <= 0 || (p->got == HS_SIZE && hs_decode(&h, p->buf, HS_HELLO))) {
        drop(p);
        return 0;
    }
    if (p->got < HS_SIZE) return 0;

    const comm *c = &t->base;
    uint32_t status = check_hello(t, &h);
    handshake ack;
    unsigned char buf[HS_SIZE];
    hs_make(&ack, HS_ACK, status, c->rank, (int)h.from, c->world);
    hs_encode(&ack, buf);
    if (status != HS_OK) {
        /* Best effort: tell the peer why; it is dropped whatever send() says. */
        (void)send(p->fd, buf, HS_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
        drop(p);
        return 0;
    }
    if (send_exact(p->fd, buf, HS_SIZE, deadline) || set_nodelay(p->fd))
        return errf(err, "answering rank %d's handshake: %s", ring_prev(c), strerror(errno));
    t->prev_fd = p->fd;
    p->fd = -1;
    return 0;
}

static short pending_events(const pending *p) {
    return p->authed ? POLLIN : auth_events(&p->auth);
}

/* Names the peer in an authentication failure; a wrong proof is the wrong job secret. */
static int auth_refused(int peer, const char *addr, errbuf *err) {
    if (err && strcmp(err->msg, AUTH_WRONG_SECRET) == 0) errprefix(err, "wrong job secret");
    return errprefix(err, "rank %d at %s", peer, addr);
}

/* Reads rank+1's answer to our HELLO (complete once link->got reaches HS_SIZE); fails
 * unless it is a valid acceptance. */
static int read_ack(tcp_comm *t, next_link *link, const char *addr, errbuf *err) {
    const comm *c = &t->base;
    int next = ring_next(c);
    ssize_t n = recv(t->next_fd, link->ack + link->got, HS_SIZE - link->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0) return errf(err, "rank %d at %s closed the connection during the handshake", next, addr);
    if (n < 0) return errf(err, "rank %d at %s: %s", next, addr, strerror(errno));
    link->got += (size_t)n;
    if (link->got < HS_SIZE) return 0;
    handshake h;
    if (hs_decode(&h, link->ack, HS_ACK))
        return errf(err, "rank %d at %s does not speak the comm handshake", next, addr);
    if (h.status != HS_OK)
        return errf(err, "rank %d at %s refused the connection: %s", next, addr,
                    hs_status_name(h.status));
    if (h.world != (uint32_t)c->world || h.from != (uint32_t)next || h.to != (uint32_t)c->rank)
        return errf(err, "rank %d at %s answered as rank %u of %u", next, addr, h.from, h.world);
    return 0;
}

/* Advances our connection to rank+1: the secret proved both ways, then our HELLO, then its
 * ACK. */
static int step_next(tcp_comm *t, next_link *link, const char *addr, double deadline,
                     errbuf *err) {
    if (link->authed) return read_ack(t, link, addr, err);
    const comm *c = &t->base;
    int next = ring_next(c);
    int rc = auth_step(&link->auth, t->next_fd, err);
    if (rc < 0) return auth_refused(next, addr, err);
    if (rc == 0) return 0;
    link->authed = 1;
    handshake hello;
    unsigned char buf[HS_SIZE];
    hs_make(&hello, HS_HELLO, HS_OK, c->rank, next, c->world);
    hs_encode(&hello, buf);
    if (send_exact(t->next_fd, buf, HS_SIZE, deadline))
        return errf(err, "rank %d at %s: sending the handshake: %s", next, addr, strerror(errno));
    return 0;
}

static short next_events(const next_link *link) {
    return link->authed ? POLLIN : auth_events(&link->auth);
}

/* Takes every waiting connection off the listener and starts its authentication; the
 * oldest stranger makes room when the table is full. */
static int accept_pending(const comm_options *opt, int listen_fd, pending *pend, int *npend,
                          errbuf *err) {
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return errf(err, "accepting a connection: %s", strerror(errno));
        }
        if (*npend == MAX_PENDING) {
            close(pend[0].fd);
            memmove(pend, pend + 1, (MAX_PENDING - 1) * sizeof *pend);
            (*npend)--;
        }
        pending *p = &pend[*npend];
        p->fd = fd;
        p->authed = 0;
        p->got = 0;
        if (auth_start(&p->auth, opt->secret, COMM_SECRET_BYTES, 0, COMM_AUTH_CONTEXT, err)) {
            close(fd);
            return -1;
        }
        (*npend)++;
    }
}

/* With the connection to rank+1 made: completes its handshake while accepting rank-1's
 * connection (turning strangers away), all from one poll() loop, since every rank of the
 * ring does both at once. */
static int finish_handshake(tcp_comm *t, const comm_options *opt, int listen_fd,
                            next_link *link, const char *next_addr, double deadline,
                            errbuf *err) {
    const comm *c = &t->base;
    pending pend[MAX_PENDING];
    int npend = 0, rc = 0;
    while (rc == 0 && (t->prev_fd < 0 || link->got < HS_SIZE)) {
        struct pollfd pf[2 + MAX_PENDING];
        int n = 0, ilisten = -1, inext = -1;
        if (t->prev_fd < 0) {
            pf[n] = (struct pollfd){listen_fd, POLLIN, 0};
            ilisten = n++;
        }
        if (link->got < HS_SIZE) {
            pf[n] = (struct pollfd){t->next_fd, next_events(link), 0};
            inext = n++;
        }
        int ifirst = n;
        for (int i = 0; i < npend; i++)
            pf[n++] = (struct pollfd){pend[i].fd, pending_events(&pend[i]), 0};

        int ms = clock_poll_ms(deadline);
        if (ms == 0) {
            rc = t->prev_fd < 0
                     ? errf(err, "timed out after %g s waiting for rank %d to connect",
                            opt->init_timeout_s, ring_prev(c))
                     : errf(err, "timed out after %g s waiting for rank %d at %s to answer",
                            opt->init_timeout_s, ring_next(c), next_addr);
            break;
        }
        int ready = poll(pf, (nfds_t)n, ms);
        if (ready < 0 && errno != EINTR) {
            rc = errf(err, "poll: %s", strerror(errno));
            break;
        }
        if (ready <= 0) continue;
        if (inext >= 0 && pf[inext].revents) rc = step_next(t, link, next_addr, deadline, err);
        for (int i = 0; rc == 0 && i < npend; i++)
            if (pf[ifirst + i].revents) rc = read_hello(t, &pend[i], deadline, err);
        int kept = 0; /* drop the connections read_hello closed or adopted */
        for (int i = 0; i < npend; i++)
            if (pend[i].fd >= 0) pend[kept++] = pend[i];
        npend = kept;
        if (rc == 0 && ilisten >= 0 && pf[ilisten].revents)
            rc = accept_pending(opt, listen_fd, pend, &npend, err);
    }
    for (int i = 0; i < npend; i++) close(pend[i].fd);
    return rc;
}

static int connect_ring(tcp_comm *t, const comm_options *opt, const char *next_addr,
                        int listen_fd, errbuf *err) {
    double deadline = clock_now_s() + opt->init_timeout_s;
    t->next_fd = connect_until(next_addr, ring_next(&t->base), deadline, opt->init_timeout_s, err);
    if (t->next_fd < 0) return -1;
    next_link link = {.authed = 0, .got = 0};
    if (auth_start(&link.auth, opt->secret, COMM_SECRET_BYTES, 1, COMM_AUTH_CONTEXT, err))
        return -1;
    return finish_handshake(t, opt, listen_fd, &link, next_addr, deadline, err);
}

/* ---- data transfer --------------------------------------------------------------------- */

static int peer_error(int peer, int e, errbuf *err) {
    if (e == ECONNRESET || e == EPIPE)
        return errf(err, "rank %d closed the connection (%s)", peer, strerror(e));
    return errf(err, "rank %d: %s", peer, strerror(e));
}

static int timed_out(const comm *c, int receiving, errbuf *err) {
    if (receiving)
        return errf(err, "timed out after %g s waiting for rank %d", c->timeout_s, ring_prev(c));
    return errf(err, "timed out after %g s: rank %d is not taking data", c->timeout_s,
                ring_next(c));
}

/* Receives what is there from rank-1, up to len. */
static int recv_some(tcp_comm *t, void *buf, size_t len, size_t *got, errbuf *err) {
    while (*got < len) {
        size_t want = len - *got < XFER_MAX ? len - *got : XFER_MAX;
        ssize_t n = recv(t->prev_fd, (char *)buf + *got, want, MSG_DONTWAIT);
        if (n > 0) {
            *got += (size_t)n;
        } else if (n == 0) {
            return errf(err, "rank %d closed the connection", ring_prev(&t->base));
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return 0;
        } else if (errno != EINTR) {
            return peer_error(ring_prev(&t->base), errno, err);
        }
    }
    return 0;
}

/* Sends what the socket takes to rank+1, up to len. */
static int send_some(tcp_comm *t, const void *buf, size_t len, size_t *sent, errbuf *err) {
    while (*sent < len) {
        size_t want = len - *sent < XFER_MAX ? len - *sent : XFER_MAX;
        ssize_t n = send(t->next_fd, (const char *)buf + *sent, want, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            *sent += (size_t)n;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return 0;
        } else if (errno != EINTR) {
            return peer_error(ring_next(&t->base), errno, err);
        }
    }
    return 0;
}

/* next_fd is readable or hung up; since nothing is ever sent back on it, rank+1 is gone
 * (or it was a false alarm: 0). */
static int check_next_alive(tcp_comm *t, errbuf *err) {
    char byte;
    int next = ring_next(&t->base);
    ssize_t n = recv(t->next_fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0) return errf(err, "rank %d closed the connection", next);
    if (n > 0) return errf(err, "rank %d sent data on a send-only connection", next);
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return peer_error(next, errno, err);
}

/* Sends slen bytes of sbuf to rank+1 while receiving rlen bytes from rank-1 into rbuf, both
 * at once, by the collective's deadline.  With `forward` (the broadcast pipeline) sbuf is
 * rbuf and only bytes already received are passed on. */
static int ring_xfer(tcp_comm *t, const void *sbuf, size_t slen, void *rbuf, size_t rlen,
                     int forward, errbuf *err) {
    size_t sent = 0, got = 0;
    while (sent < slen || got < rlen) {
        size_t sendable = forward ? got : slen;
        struct pollfd pf[2];
        int n = 0, inext = -1, iprev = -1;
        if (sent < slen) { /* watched while we owe it data, to notice rank+1 going away */
            short ev = (short)(POLLIN | POLLRDHUP | (sent < sendable ? POLLOUT : 0));
            pf[n] = (struct pollfd){t->next_fd, ev, 0};
            inext = n++;
        }
        if (got < rlen) {
            pf[n] = (struct pollfd){t->prev_fd, POLLIN, 0};
            iprev = n++;
        }
        int ms = clock_poll_ms(t->base.deadline);
        if (ms == 0) return timed_out(&t->base, got < rlen, err);
        int ready = poll(pf, (nfds_t)n, ms);
        if (ready < 0 && errno != EINTR) return errf(err, "poll: %s", strerror(errno));
        if (ready <= 0) continue;
        if (iprev >= 0 && pf[iprev].revents && recv_some(t, rbuf, rlen, &got, err)) return -1;
        if (inext >= 0 && (pf[inext].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) &&
            check_next_alive(t, err))
            return -1;
        sendable = forward ? got : slen;
        if (sent < sendable && send_some(t, sbuf, sendable, &sent, err)) return -1;
    }
    return 0;
}

/* ---- collectives ----------------------------------------------------------------------- */

/* Chunk i of n elements cut in pieces of `per` (the last ones may be short or empty). */
static size_t chunk_off(size_t n, size_t per, int i) {
    size_t off = per * (size_t)i;
    return off < n ? off : n;
}

static size_t chunk_len(size_t n, size_t per, int i) {
    return chunk_off(n, per, i + 1) - chunk_off(n, per, i);
}

/* In place: chunk i of buf is rank i's; in step k each rank passes on the chunk it got in
 * step k-1 (its own first). */
static int ring_all_gather(tcp_comm *t, char *buf, size_t esize, size_t n, size_t per,
                           errbuf *err) {
    const comm *c = &t->base;
    for (int k = 0; k < c->world - 1; k++) {
        int s = ring_mod(c, c->rank - k), r = ring_mod(c, c->rank - k - 1);
        if (ring_xfer(t, buf + chunk_off(n, per, s) * esize, chunk_len(n, per, s) * esize,
                      buf + chunk_off(n, per, r) * esize, chunk_len(n, per, r) * esize, 0, err))
            return -1;
    }
    return 0;
}

/* dst[i] = src[off + i] as fp32 */
static void load_f32(float *dst, const void *src, comm_dtype dt, size_t off, size_t len) {
    if (dt == COMM_F32) {
        memcpy(dst, (const float *)src + off, len * sizeof(float));
        return;
    }
    bf16_to_f32_n(dst, (const uint16_t *)src + off, len);
}

/* dst[i] = partial[i] + src[off + i]: the sum so far, then this rank's value. */
static void add_f32(float *dst, const float *partial, const void *src, comm_dtype dt, size_t off,
                    size_t len) {
    if (dt == COMM_F32) {
        const float *s = (const float *)src + off;
        for (size_t i = 0; i < len; i++) dst[i] = partial[i] + s[i];
        return;
    }
    const uint16_t *s = (const uint16_t *)src + off;
    for (size_t i = 0; i < len; i++) dst[i] = partial[i] + bf16_to_f32(s[i]);
}

/* Leaves in acc the fp32 sum over ranks of this rank's chunk of src (chunks as above).
 * Chunk i starts at rank i+1 and goes round the ring, each rank adding its own values to
 * the partial sum it received.  acc and tmp hold `per` floats. */
static int ring_reduce_scatter(tcp_comm *t, const void *src, comm_dtype dt, size_t n, size_t per,
                               float *acc, float *tmp, errbuf *err) {
    const comm *c = &t->base;
    int first = ring_mod(c, c->rank - 1);
    load_f32(acc, src, dt, chunk_off(n, per, first), chunk_len(n, per, first));
    for (int k = 0; k < c->world - 1; k++) {
        int s = ring_mod(c, c->rank - k - 1), r = ring_mod(c, c->rank - k - 2);
        size_t rlen = chunk_len(n, per, r);
        if (ring_xfer(t, acc, chunk_len(n, per, s) * sizeof(float), tmp, rlen * sizeof(float), 0,
                      err))
            return -1;
        add_f32(acc, tmp, src, dt, chunk_off(n, per, r), rlen);
    }
    return 0;
}

/* dst = acc (divided by the world size for AVG) as dt, rounded once. */
static void store_result(void *dst, const float *acc, size_t len, comm_dtype dt, comm_op op,
                         int world) {
    for (size_t i = 0; i < len; i++) {
        float v = op == COMM_AVG ? acc[i] / (float)world : acc[i];
        if (dt == COMM_F32)
            ((float *)dst)[i] = v;
        else
            ((uint16_t *)dst)[i] = bf16_from_f32(v);
    }
}

/* Two buffers of `per` floats for ring_reduce_scatter, in one allocation. */
static float *alloc_scratch(size_t per, errbuf *err) {
    size_t bytes = 2 * per * sizeof(float);
    float *p = malloc(bytes ? bytes : 1);
    if (!p) errf(err, "out of memory (%zu bytes of scratch)", bytes);
    return p;
}

static int tcp_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                          errbuf *err) {
    size_t esize = comm_dtype_size(dt);
    char *own = (char *)recv + (size_t)c->rank * count * esize;
    if (own != send) memmove(own, send, count * esize);
    return ring_all_gather((tcp_comm *)c, recv, esize, count * (size_t)c->world, count, err);
}

static int tcp_reduce_scatter(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                              comm_op op, errbuf *err) {
    float *acc = alloc_scratch(count, err);
    if (!acc) return -1;
    int rc = ring_reduce_scatter((tcp_comm *)c, send, dt, count * (size_t)c->world, count, acc,
                                 acc + count, err);
    if (rc == 0) store_result(recv, acc, count, dt, op, c->world);
    free(acc);
    return rc;
}

static int tcp_all_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                          errbuf *err) {
    tcp_comm *t = (tcp_comm *)c;
    size_t esize = comm_dtype_size(dt), per = (count + (size_t)c->world - 1) / (size_t)c->world;
    float *acc = alloc_scratch(per, err);
    if (!acc) return -1;
    int rc = ring_reduce_scatter(t, buf, dt, count, per, acc, acc + per, err);
    if (rc == 0) {
        store_result((char *)buf + chunk_off(count, per, c->rank) * esize, acc,
                     chunk_len(count, per, c->rank), dt, op, c->world);
        rc = ring_all_gather(t, buf, esize, count, per, err);
    }
    free(acc);
    return rc;
}

static int tcp_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root,
                         errbuf *err) {
    tcp_comm *t = (tcp_comm *)c;
    size_t bytes = count * comm_dtype_size(dt);
    if (c->world == 1) return 0;
    if (c->rank == root) return ring_xfer(t, buf, bytes, NULL, 0, 0, err);
    if (ring_next(c) == root) return ring_xfer(t, NULL, 0, buf, bytes, 0, err);
    return ring_xfer(t, buf, bytes, buf, bytes, 1, err);
}

static int tcp_barrier(comm *c, errbuf *err) {
    unsigned char out = 1, in;
    for (int k = 0; k < c->world - 1; k++)
        if (ring_xfer((tcp_comm *)c, &out, 1, &in, 1, 0, err)) return -1;
    return 0;
}

static void tcp_abort(comm *c) {
    tcp_comm *t = (tcp_comm *)c;
    /* shutdown, not close: another thread may be polling these fds.  It fails only on
     * sockets that are already down. */
    if (t->next_fd >= 0) (void)shutdown(t->next_fd, SHUT_RDWR);
    if (t->prev_fd >= 0) (void)shutdown(t->prev_fd, SHUT_RDWR);
}

static void tcp_destroy(comm *c) {
    tcp_comm *t = (tcp_comm *)c;
    if (t->next_fd >= 0) close(t->next_fd);
    if (t->prev_fd >= 0) close(t->prev_fd);
    free(t);
}

static const comm_ops tcp_ops = {
    .all_gather = tcp_all_gather,
    .reduce_scatter = tcp_reduce_scatter,
    .all_reduce = tcp_all_reduce,
    .broadcast = tcp_broadcast,
    .barrier = tcp_barrier,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};

/* ---- comm_init ------------------------------------------------------------------------- */

static int build(comm **out, const comm_options *opt, int rank, const comm_rank_table *table,
                 const comm_listener *l, errbuf *err) {
    int world = table->world;
    if (world < 1 || world > COMM_MAX_WORLD)
        return errf(err, "world size %d is not in [1, %d]", world, COMM_MAX_WORLD);
    if (rank < 0 || rank >= world) return errf(err, "rank %d is not in a world of %d", rank, world);
    int next = (rank + 1) % world;
    if (world > 1 && (!l || l->fd < 0)) return errf(err, "no listener");
    if (world > 1 && (!table->addr || !table->addr[next]))
        return errf(err, "no address for rank %d", next);

    tcp_comm *t = calloc(1, sizeof *t);
    if (!t) return errf(err, "out of memory");
    t->next_fd = t->prev_fd = -1;
    if (comm_setup(&t->base, &tcp_ops, rank, world, opt, err) ||
        (world > 1 && connect_ring(t, opt, table->addr[next], l->fd, err))) {
        tcp_destroy(&t->base);
        return -1;
    }
    *out = &t->base;
    return 0;
}

int comm_init(comm **out, const comm_options *opt, int rank, const comm_rank_table *table,
              comm_listener *l, errbuf *err) {
    int rc;
    if (!out || !opt || !table) {
        rc = errf(err, "comm_init: missing argument");
    } else {
        *out = NULL;
        rc = build(out, opt, rank, table, l, err);
        if (rc) errprefix(err, "comm_init (rank %d of %d)", rank, table->world);
    }
    comm_listener_close(l);
    return rc;
}

/* ---- comm_tcp_split -------------------------------------------------------------------- */

/* What every rank of the parent publishes to the others: its color and new address. */
typedef struct split_entry {
    int32_t color;
    char addr[COMM_ADDR_MAX];
} split_entry;

int comm_tcp_split(comm *parent, const comm_options *opt, const char *bind_host, int color,
                   comm **out, errbuf *err) {
    *out = NULL;
    int world = comm_world(parent), self = comm_rank(parent), n = 0, me = 0;
    comm_listener l;
    if (comm_tcp_listen(&l, bind_host, err)) return errprefix(err, "comm split");
    split_entry *all = calloc((size_t)world, sizeof *all);
    const char **addr = calloc((size_t)world, sizeof *addr);
    int rc = all && addr ? 0 : errf(err, "out of memory");
    if (rc == 0) {
        all[self].color = color;
        snprintf(all[self].addr, sizeof all[self].addr, "%s", l.addr);
        rc = comm_all_gather(parent, &all[self], all, sizeof *all, COMM_BYTE, err);
    }
    for (int r = 0; rc == 0 && r < world; r++) { /* the members, in the parent's rank order */
        if (all[r].color != color) continue;
        if (r == self) me = n;
        addr[n++] = all[r].addr;
    }
    if (rc == 0) {
        comm_rank_table table = {.world = n, .addr = addr};
        rc = comm_init(out, opt, me, &table, &l, err);
    }
    comm_listener_close(&l);
    free(all);
    free(addr);
    return rc ? errprefix(err, "comm split (color %d)", color) : 0;
}
