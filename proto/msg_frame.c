/* msg framing: headers, the incremental decoder, blocking frame I/O.  See msg.h. */
#include "base/bytes.h"
#include "msg.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char *const type_names[MSG_TYPE_END] = {
    [MSG_HELLO] = "HELLO",
    [MSG_CONFIG] = "CONFIG",
    [MSG_NCCL_ID] = "NCCL_ID",
    [MSG_START] = "START",
    [MSG_HEARTBEAT] = "HEARTBEAT",
    [MSG_METRICS] = "METRICS",
    [MSG_CKPT_BEGIN] = "CKPT_BEGIN",
    [MSG_CKPT_DONE] = "CKPT_DONE",
    [MSG_CKPT_ABORT] = "CKPT_ABORT",
    [MSG_STOP] = "STOP",
    [MSG_FATAL] = "FATAL",
    [MSG_ADDR] = "ADDR",
    [MSG_PEERS] = "PEERS",
    [MSG_JOIN] = "JOIN",
    [MSG_NODE_HEARTBEAT] = "NODE_HEARTBEAT",
    [MSG_CKPT_REQUEST] = "CKPT_REQUEST",
    [MSG_PLAN] = "PLAN",
    [MSG_RENDEZVOUS] = "RENDEZVOUS",
    [MSG_NODE_ADDRS] = "NODE_ADDRS",
    [MSG_NODE_READY] = "NODE_READY",
    [MSG_NODE_DONE] = "NODE_DONE",
    [MSG_REFUSED] = "REFUSED",
    [MSG_SAMPLE] = "SAMPLE",
};

/* A decoder keeps at most this much buffer around while idle. */
#define IDLE_BUFFER_MAX (64u << 10)

const char *msg_type_name(int type) {
    if (type <= 0 || type >= MSG_TYPE_END) return "UNKNOWN";
    return type_names[type];
}

void msg_frame_free(msg_frame *m) {
    free(m->body);
    m->body = NULL;
    m->len = 0;
}

int msg_encode_header(uint8_t header[MSG_HEADER_SIZE], int type, size_t body_len, errbuf *err) {
    if (type <= 0 || type >= MSG_TYPE_END) return errf(err, "message type %d: unknown", type);
    if (body_len > MSG_MAX_BODY)
        return errf(err, "%s: body of %zu bytes exceeds the %u-byte limit", msg_type_name(type),
                    body_len, MSG_MAX_BODY);
    memcpy(header, MSG_MAGIC, 4);
    le_put_u16(header + 4, MSG_VERSION);
    le_put_u16(header + 6, (uint16_t)type);
    le_put_u32(header + 8, (uint32_t)body_len);
    return 0;
}

int msg_frame_encode(int type, const void *body, size_t len, uint8_t **out, size_t *frame_len,
                     errbuf *err) {
    uint8_t header[MSG_HEADER_SIZE];
    if (msg_encode_header(header, type, len, err)) return -1;
    uint8_t *frame = malloc(MSG_HEADER_SIZE + len);
    if (!frame) return errf(err, "%s: out of memory for a %zu-byte frame", msg_type_name(type), len);
    memcpy(frame, header, MSG_HEADER_SIZE);
    if (len) memcpy(frame + MSG_HEADER_SIZE, body, len);
    *out = frame;
    *frame_len = MSG_HEADER_SIZE + len;
    return 0;
}

/* n (1..4) leading bytes of a frame that are not the magic. */
static int bad_magic(const uint8_t *p, size_t n, errbuf *err) {
    char hex[16] = "";
    for (size_t i = 0; i < n && i < 4; i++)
        snprintf(hex + 3 * i, sizeof hex - 3 * i, " %02x", p[i]);
    return errf(err, "bad magic:%s (expected \"%s\": not a control stream)", hex, MSG_MAGIC);
}

/* Checks a whole header; fills *type and *len. */
static int check_header(const uint8_t *h, msg_type *type, uint32_t *len, errbuf *err) {
    if (memcmp(h, MSG_MAGIC, 4) != 0) return bad_magic(h, 4, err);
    uint16_t version = le_get_u16(h + 4), t = le_get_u16(h + 6);
    uint32_t n = le_get_u32(h + 8);
    if (version != MSG_VERSION)
        return errf(err, "protocol version %u (this build speaks version %d)", version,
                    MSG_VERSION);
    if (t == 0 || t >= MSG_TYPE_END) return errf(err, "unknown message type %u", t);
    if (n > MSG_MAX_BODY)
        return errf(err, "%s: body of %u bytes exceeds the %u-byte limit", msg_type_name(t), n,
                    MSG_MAX_BODY);
    *type = (msg_type)t;
    *len = n;
    return 0;
}

/* ---- incremental decoder ---- */

void msg_decoder_init(msg_decoder *d) { memset(d, 0, sizeof *d); }

void msg_decoder_free(msg_decoder *d) {
    free(d->buf);
    msg_decoder_init(d);
}

size_t msg_decoder_buffered(const msg_decoder *d) { return d->end - d->start; }

int msg_decoder_feed(msg_decoder *d, const void *data, size_t len, errbuf *err) {
    if (d->broken || len == 0) return 0;
    if (d->end + len > d->cap && d->start > 0) {
        memmove(d->buf, d->buf + d->start, d->end - d->start);
        d->end -= d->start;
        d->start = 0;
    }
    if (len > SIZE_MAX / 2 - d->end) return errf(err, "control stream: %zu bytes is too many", len);
    if (d->end + len > d->cap) {
        size_t cap = d->cap ? d->cap : 4096;
        while (cap < d->end + len) cap *= 2;
        uint8_t *bigger = realloc(d->buf, cap);
        if (!bigger) return errf(err, "control stream: out of memory for %zu bytes", cap);
        d->buf = bigger;
        d->cap = cap;
    }
    memcpy(d->buf + d->end, data, len);
    d->end += len;
    return 0;
}

static int broken(msg_decoder *d, errbuf *err) {
    d->broken = 1;
    if (err) d->error = *err;
    return -1;
}

int msg_decoder_next(msg_decoder *d, msg_frame *out, errbuf *err) {
    if (d->broken) {
        if (err) *err = d->error;
        return -1;
    }
    errbuf local;
    if (!err) err = &local; /* the decoder remembers why it broke even if the caller does not */
    size_t avail = d->end - d->start;
    if (avail == 0) return 0;
    const uint8_t *p = d->buf + d->start;
    if (avail < MSG_HEADER_SIZE) {
        /* Garbage is recognisable from its first byte; no need to wait for a whole header. */
        size_t n = avail < 4 ? avail : 4;
        if (memcmp(p, MSG_MAGIC, n) != 0) {
            bad_magic(p, n, err);
            return broken(d, err);
        }
        return 0;
    }
    msg_type type;
    uint32_t len;
    if (check_header(p, &type, &len, err)) return broken(d, err);
    if (avail - MSG_HEADER_SIZE < len) return 0;
    char *body = malloc((size_t)len + 1);
    if (!body) {
        errf(err, "%s: out of memory for a %u-byte body", msg_type_name(type), len);
        return broken(d, err);
    }
    if (len) memcpy(body, p + MSG_HEADER_SIZE, len);
    body[len] = '\0';
    out->type = type;
    out->len = len;
    out->body = body;
    d->start += MSG_HEADER_SIZE + len;
    if (d->start == d->end) {
        d->start = d->end = 0;
        if (d->cap > IDLE_BUFFER_MAX) { /* after a large message, give the memory back */
            free(d->buf);
            d->buf = NULL;
            d->cap = 0;
        }
    }
    return 1;
}

/* ---- blocking helpers ---- */

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for `events`; deadline_ms < 0 waits forever.  Returns 0 when
 * ready, 1 on timeout, -1 on error. */
static int wait_fd(int fd, short events, long long deadline_ms, errbuf *err) {
    for (;;) {
        int timeout = -1;
        if (deadline_ms >= 0) {
            long long left = deadline_ms - now_ms();
            if (left <= 0) return 1;
            timeout = left > 1000000000 ? 1000000000 : (int)left;
        }
        struct pollfd pfd = {.fd = fd, .events = events};
        int r = poll(&pfd, 1, timeout);
        if (r > 0) return 0; /* readable, or an error/hangup that read/send will report */
        if (r == 0) continue;  /* recheck the deadline */
        if (errno != EINTR) return errf(err, "poll: %s", strerror(errno));
    }
}

static int send_all(int fd, struct iovec *iov, int n, const char *what, errbuf *err) {
    while (n > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (wait_fd(fd, POLLOUT, -1, err)) return -1;
                continue;
            }
            if (errno == EPIPE || errno == ECONNRESET)
                return errf(err, "sending %s: peer closed", what);
            return errf(err, "sending %s: %s", what, strerror(errno));
        }
        size_t done = (size_t)w;
        while (n > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    return 0;
}

int msg_send_frame(int fd, int type, const void *body, size_t len, errbuf *err) {
    uint8_t header[MSG_HEADER_SIZE];
    if (msg_encode_header(header, type, len, err)) return -1;
    struct iovec iov[2] = {{header, sizeof header}, {(void *)body, len}};
    return send_all(fd, iov, 2, msg_type_name(type), err);
}

/* Reads exactly len bytes; *got counts what arrived.  Returns 0, 1 on timeout, 2 at the end
 * of the stream, -1 on error. */
static int recv_all(int fd, void *buf, size_t len, long long deadline_ms, size_t *got,
                    errbuf *err) {
    *got = 0;
    while (*got < len) {
        if (deadline_ms >= 0) {
            int w = wait_fd(fd, POLLIN, deadline_ms, err);
            if (w) return w;
        }
        ssize_t r = read(fd, (char *)buf + *got, len - *got);
        if (r == 0) return 2;
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int w = wait_fd(fd, POLLIN, deadline_ms, err);
                if (w) return w;
                continue;
            }
            if (errno == ECONNRESET) return 2;
            return errf(err, "read: %s", strerror(errno));
        }
        *got += (size_t)r;
    }
    return 0;
}

int msg_recv_frame(int fd, msg_frame *out, int timeout_ms, errbuf *err) {
    long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    uint8_t header[MSG_HEADER_SIZE];
    size_t got;
    int r = recv_all(fd, header, sizeof header, deadline, &got, err);
    if (r == 1 && got == 0) return errf(err, "no message within %d ms", timeout_ms);
    if (r == 2 && got == 0) return errf(err, "peer closed");
    if (r == 1) return errf(err, "timed out after %d ms inside a message header", timeout_ms);
    if (r == 2) return errf(err, "peer closed inside a message header (%zu of %d bytes)", got,
                            MSG_HEADER_SIZE);
    if (r) return -1;
    msg_type type;
    uint32_t len;
    if (check_header(header, &type, &len, err)) return -1;
    char *body = malloc((size_t)len + 1);
    if (!body) return errf(err, "%s: out of memory for a %u-byte body", msg_type_name(type), len);
    r = recv_all(fd, body, len, deadline, &got, err);
    if (r) {
        free(body);
        if (r == 1)
            return errf(err, "%s: timed out after %d ms with %zu of %u body bytes",
                        msg_type_name(type), timeout_ms, got, len);
        if (r == 2)
            return errf(err, "%s: peer closed after %zu of %u body bytes", msg_type_name(type),
                        got, len);
        return -1;
    }
    body[len] = '\0';
    out->type = type;
    out->len = len;
    out->body = body;
    return 0;
}
