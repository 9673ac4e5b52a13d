/* auth: the job secret proven by HMAC challenge and response; see auth.h. */
#include "base/auth.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "base/clock.h"

static const unsigned char auth_magic[8] = {'F', 'S', 'D', 'P', 'A', 'U', 'T', '1'};

/* HMAC(secret, "fsdp-auth-v1" role len(context) context prover_nonce verifier_nonce). */
static void auth_proof(const auth_session *a, int initiator_proves, const unsigned char *prover,
                       const unsigned char *verifier, unsigned char out[SHA256_BYTES]) {
    size_t clen = strlen(a->context);
    unsigned char head[12 + 1 + 4];
    memcpy(head, "fsdp-auth-v1", 12);
    head[12] = initiator_proves ? 'I' : 'R';
    for (int i = 0; i < 4; i++) head[13 + i] = (unsigned char)((uint32_t)clen >> (24 - 8 * i));
    hmac_sha256_ctx h;
    hmac_sha256_init(&h, a->secret, a->secret_len);
    hmac_sha256_update(&h, head, sizeof head);
    hmac_sha256_update(&h, a->context, clen);
    hmac_sha256_update(&h, prover, AUTH_NONCE_BYTES);
    hmac_sha256_update(&h, verifier, AUTH_NONCE_BYTES);
    hmac_sha256_final(&h, out);
}

/* Constant time: a stranger learns nothing from how long a wrong proof takes to refuse. */
static int bytes_equal(const unsigned char *a, const unsigned char *b, size_t n) {
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

int auth_start(auth_session *a, const unsigned char *secret, size_t secret_len, int initiator,
               const char *context, errbuf *err) {
    memset(a, 0, sizeof *a);
    if (secret_len == 0) return errf(err, "authentication: the secret is empty");
    a->secret = secret;
    a->secret_len = secret_len;
    a->context = context;
    a->initiator = initiator != 0;
    size_t have = 0;
    while (have < AUTH_NONCE_BYTES) {
        ssize_t n = getrandom(a->nonce + have, AUTH_NONCE_BYTES - have, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errf(err, "authentication: getrandom: %s", strerror(errno));
        have += (size_t)n;
    }
    memcpy(a->out, auth_magic, 8);
    memcpy(a->out + 8, a->nonce, AUTH_NONCE_BYTES);
    a->out_len = AUTH_HELLO_BYTES;
    return 0;
}

static int flush_out(auth_session *a, int fd, errbuf *err) {
    while (a->sent < a->out_len) {
        ssize_t n = send(fd, a->out + a->sent, a->out_len - a->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            a->sent += (size_t)n;
            continue;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == EPIPE || errno == ECONNRESET)
            return errf(err, "peer closed the connection during authentication");
        return errf(err, "authentication: sending: %s", strerror(errno));
    }
    return 0;
}

static int fill_in(auth_session *a, int fd, errbuf *err) {
    while (a->got < AUTH_WIRE_BYTES) {
        ssize_t n = recv(fd, a->in + a->got, AUTH_WIRE_BYTES - a->got, MSG_DONTWAIT);
        if (n > 0) {
            a->got += (size_t)n;
            continue;
        }
        if (n == 0) return errf(err, "peer closed the connection during authentication");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == ECONNRESET)
            return errf(err, "peer closed the connection during authentication");
        return errf(err, "authentication: receiving: %s", strerror(errno));
    }
    return 0;
}

int auth_step(auth_session *a, int fd, errbuf *err) {
    if (flush_out(a, fd, err) || fill_in(a, fd, err)) return -1;
    const unsigned char *peer_nonce = a->in + 8;
    if (a->out_len == AUTH_HELLO_BYTES && a->got >= AUTH_HELLO_BYTES) {
        if (memcmp(a->in, auth_magic, 8) != 0)
            return errf(err, "peer does not speak the fsdp authentication handshake");
        auth_proof(a, a->initiator, a->nonce, peer_nonce, a->out + AUTH_HELLO_BYTES);
        a->out_len = AUTH_WIRE_BYTES;
        if (flush_out(a, fd, err)) return -1;
    }
    if (!a->verified && a->got == AUTH_WIRE_BYTES) {
        unsigned char want[SHA256_BYTES];
        auth_proof(a, !a->initiator, peer_nonce, a->nonce, want);
        if (!bytes_equal(want, a->in + AUTH_HELLO_BYTES, SHA256_BYTES))
            return errf(err, AUTH_WRONG_SECRET);
        a->verified = 1;
    }
    return a->verified && a->sent == a->out_len;
}

short auth_events(const auth_session *a) {
    short ev = 0;
    if (a->sent < a->out_len) ev |= POLLOUT;
    if (a->got < AUTH_WIRE_BYTES) ev |= POLLIN;
    return ev;
}

int auth_handshake(int fd, const unsigned char *secret, size_t secret_len, int initiator,
                   const char *context, double deadline_s, errbuf *err) {
    auth_session a;
    if (auth_start(&a, secret, secret_len, initiator, context, err)) return -1;
    for (;;) {
        int rc = auth_step(&a, fd, err);
        if (rc != 0) return rc < 0 ? -1 : 0;
        int ms = clock_poll_ms(deadline_s);
        if (ms == 0) return errf(err, "authentication timed out: the peer did not answer");
        struct pollfd p = {fd, auth_events(&a), 0};
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return errf(err, "authentication: poll: %s", strerror(errno));
    }
}
