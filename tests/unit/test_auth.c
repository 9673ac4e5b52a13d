/* Unit tests for base/auth over socketpair(): the right secret passes both ways (blocking
 * and non-blocking sockets), a wrong secret or another context fails on both sides naming
 * it, garbage, an early close and silence fail without hanging, and neither a recorded
 * session nor our own bytes reflected back get in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/clock.h"

static const unsigned char secret_a[32] = "0123456789abcdef0123456789abcdef";
static const unsigned char secret_b[32] = "0123456789abcdef0123456789abcdeF";

/* One end of a handshake, run in a thread. */
typedef struct side {
    int fd;
    const unsigned char *secret;
    int initiator;
    const char *context;
    double timeout_s;
    int rc;
    errbuf err;
} side;

static void *run_side(void *arg) {
    side *s = arg;
    s->rc = auth_handshake(s->fd, s->secret, 32, s->initiator, s->context,
                           clock_now_s() + s->timeout_s, &s->err);
    return NULL;
}

static void make_pair(int fds[2]) { assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }

/* Runs the initiator on fds[0] in a thread and the responder on fds[1] here. */
static void run_both(side *init, side *resp) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, run_side, init), 0);
    run_side(resp);
    assert_int_equal(pthread_join(t, NULL), 0);
}

static void handshake_pair(const unsigned char *sa, const char *ca, const unsigned char *sb,
                           const char *cb, int nonblocking, side *init, side *resp) {
    int fds[2];
    make_pair(fds);
    for (int i = 0; nonblocking && i < 2; i++)
        assert_int_equal(fcntl(fds[i], F_SETFL, O_NONBLOCK), 0);
    *init = (side){fds[0], sa, 1, ca, 5, 0, {""}};
    *resp = (side){fds[1], sb, 0, cb, 5, 0, {""}};
    run_both(init, resp);
    close(fds[0]);
    close(fds[1]);
}

static void test_right_secret_passes(void **state) {
    (void)state;
    side i, r;
    for (int nb = 0; nb < 2; nb++) {
        handshake_pair(secret_a, "fsdp-comm ring", secret_a, "fsdp-comm ring", nb, &i, &r);
        if (i.rc || r.rc) fail_msg("initiator: %s / responder: %s", i.err.msg, r.err.msg);
    }
}

static void expect_fails(const side *s, const char *want) {
    if (s->rc == 0) fail_msg("the %s passed", s->initiator ? "initiator" : "responder");
    if (!strstr(s->err.msg, want)) fail_msg("\"%s\" lacks \"%s\"", s->err.msg, want);
}

static void test_wrong_secret_fails_both_sides(void **state) {
    (void)state;
    side i, r;
    handshake_pair(secret_a, "fsdp-comm ring", secret_b, "fsdp-comm ring", 0, &i, &r);
    expect_fails(&i, AUTH_WRONG_SECRET);
    expect_fails(&r, AUTH_WRONG_SECRET);
}

/* A proof made for one use does not pass for another. */
static void test_other_context_fails(void **state) {
    (void)state;
    side i, r;
    handshake_pair(secret_a, "fsdp-comm ring", secret_a, "fsdp-daemon", 0, &i, &r);
    expect_fails(&i, AUTH_WRONG_SECRET);
    expect_fails(&r, AUTH_WRONG_SECRET);
}

/* Runs `s` against a peer end that `peer` plays by hand, in a thread. */
static void against(side *s, int fds[2], void (*peer)(int fd, void *arg), void *arg) {
    pthread_t t;
    s->fd = fds[0];
    assert_int_equal(pthread_create(&t, NULL, run_side, s), 0);
    peer(fds[1], arg);
    assert_int_equal(pthread_join(t, NULL), 0);
    close(fds[0]);
    close(fds[1]);
}

static void send_garbage(int fd, void *arg) {
    (void)arg;
    char junk[200];
    memset(junk, 'x', sizeof junk);
    assert_int_equal(send(fd, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
}

/* Reads the hello, sends one back (our magic, nonce 7s), then hangs up before any proof. */
static void hello_then_close(int fd, void *arg) {
    (void)arg;
    unsigned char buf[AUTH_HELLO_BYTES];
    assert_int_equal(recv(fd, buf, sizeof buf, MSG_WAITALL), (ssize_t)sizeof buf);
    memset(buf + 8, 7, AUTH_NONCE_BYTES);
    assert_int_equal(send(fd, buf, sizeof buf, MSG_NOSIGNAL), (ssize_t)sizeof buf);
    shutdown(fd, SHUT_WR);
}

static void close_at_once(int fd, void *arg) {
    (void)arg;
    shutdown(fd, SHUT_RDWR);
}

static void say_nothing(int fd, void *arg) {
    (void)fd;
    clock_sleep_s(*(double *)arg);
}

static void test_bad_peers_fail_fast(void **state) {
    (void)state;
    for (int initiator = 0; initiator < 2; initiator++) {
        int fds[2];
        side s = {-1, secret_a, initiator, "fsdp-daemon", 5, 0, {""}};
        make_pair(fds);
        against(&s, fds, send_garbage, NULL);
        expect_fails(&s, "does not speak the fsdp authentication handshake");
        make_pair(fds);
        against(&s, fds, close_at_once, NULL);
        expect_fails(&s, "closed the connection during authentication");
        make_pair(fds);
        against(&s, fds, hello_then_close, NULL);
        expect_fails(&s, "closed the connection during authentication");
    }
}

/* A peer that connects and says nothing: the deadline ends it. */
static void test_silent_peer_times_out(void **state) {
    (void)state;
    int fds[2];
    side s = {-1, secret_a, 0, "fsdp-daemon", 0.3, 0, {""}};
    double hold = 2, t0 = clock_now_s();
    make_pair(fds);
    pthread_t t;
    s.fd = fds[0];
    assert_int_equal(pthread_create(&t, NULL, run_side, &s), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    double elapsed = clock_now_s() - t0;
    say_nothing(fds[1], &hold); /* the peer stayed connected throughout */
    close(fds[0]);
    close(fds[1]);
    expect_fails(&s, "timed out");
    assert_true(elapsed >= 0.29 && elapsed < 1.5);
}

/* A man in the middle: forwards both ways between an initiator's end `ia` and a responder's
 * end `ra` until each has sent its share, recording the initiator's; flip_i / flip_r >= 0:
 * that byte of the initiator's / responder's share arrives with its lowest bit flipped. */
static void relay(int ia, int ra, unsigned char *from_initiator, int flip_i, int flip_r) {
    unsigned char from_responder[AUTH_WIRE_BYTES];
    size_t gi = 0, gr = 0;
    while (gi < AUTH_WIRE_BYTES || gr < AUTH_WIRE_BYTES) {
        struct pollfd p[2] = {{ia, POLLIN, 0}, {ra, POLLIN, 0}};
        assert_true(poll(p, 2, 5000) > 0);
        if (p[0].revents && gi < AUTH_WIRE_BYTES) {
            ssize_t n = recv(ia, from_initiator + gi, AUTH_WIRE_BYTES - gi, 0);
            assert_true(n > 0);
            if (flip_i >= (int)gi && flip_i < (int)gi + n) from_initiator[flip_i] ^= 1;
            assert_int_equal(send(ra, from_initiator + gi, (size_t)n, MSG_NOSIGNAL), n);
            gi += (size_t)n;
        }
        if (p[1].revents && gr < AUTH_WIRE_BYTES) {
            ssize_t n = recv(ra, from_responder + gr, AUTH_WIRE_BYTES - gr, 0);
            assert_true(n > 0);
            if (flip_r >= (int)gr && flip_r < (int)gr + n) from_responder[flip_r] ^= 1;
            assert_int_equal(send(ia, from_responder + gr, (size_t)n, MSG_NOSIGNAL), n);
            gr += (size_t)n;
        }
    }
}

static void replay(int fd, void *arg) {
    assert_int_equal(send(fd, arg, AUTH_WIRE_BYTES, MSG_NOSIGNAL), AUTH_WIRE_BYTES);
    unsigned char sink[AUTH_WIRE_BYTES];
    (void)recv(fd, sink, sizeof sink, MSG_WAITALL); /* until the responder hangs up */
}

/* An eavesdropper's recording of a good session does not pass later: the responder's nonce
 * is new.  The recording does not contain the secret either. */
/* Both ends of one handshake through the relay (flip_i, flip_r as relay's). */
static void through_relay(side *i, side *r, unsigned char *transcript, int flip_i, int flip_r) {
    int fi[2], fr[2];
    make_pair(fi);
    make_pair(fr);
    *i = (side){fi[0], secret_a, 1, "fsdp-daemon", 5, 0, {""}};
    *r = (side){fr[0], secret_a, 0, "fsdp-daemon", 5, 0, {""}};
    pthread_t ti, tr;
    assert_int_equal(pthread_create(&ti, NULL, run_side, i), 0);
    assert_int_equal(pthread_create(&tr, NULL, run_side, r), 0);
    relay(fi[1], fr[1], transcript, flip_i, flip_r);
    assert_int_equal(pthread_join(ti, NULL), 0);
    assert_int_equal(pthread_join(tr, NULL), 0);
    for (int k = 0; k < 2; k++) close(fi[k]), close(fr[k]);
}

static void test_replayed_session_fails(void **state) {
    (void)state;
    unsigned char transcript[AUTH_WIRE_BYTES];
    side i, r;
    through_relay(&i, &r, transcript, -1, -1);
    if (i.rc || r.rc) fail_msg("through the relay: %s / %s", i.err.msg, r.err.msg);
    assert_null(memmem(transcript, sizeof transcript, secret_a, 8));

    side again = {-1, secret_a, 0, "fsdp-daemon", 5, 0, {""}};
    int fds[2];
    make_pair(fds);
    against(&again, fds, replay, transcript);
    expect_fails(&again, AUTH_WRONG_SECRET);
}

/* A peer that sends back whatever we send (all of it: one side's share of a handshake):
 * our own proof must not pass as its. */
static void echo(int fd, void *arg) {
    (void)arg;
    unsigned char buf[AUTH_WIRE_BYTES];
    size_t done = 0;
    while (done < AUTH_WIRE_BYTES) {
        ssize_t n = recv(fd, buf, AUTH_WIRE_BYTES - done, 0);
        if (n <= 0 || send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
        done += (size_t)n;
    }
}

static void test_reflection_fails(void **state) {
    (void)state;
    for (int initiator = 0; initiator < 2; initiator++) {
        int fds[2];
        side s = {-1, secret_a, initiator, "fsdp-daemon", 5, 0, {""}};
        make_pair(fds);
        against(&s, fds, echo, NULL);
        expect_fails(&s, AUTH_WRONG_SECRET);
    }
}

/* Every byte of a right proof counts, the last one included: one bit flipped anywhere in
 * either side's proof and the other side refuses it. */
static void test_every_proof_byte_counts(void **state) {
    (void)state;
    unsigned char transcript[AUTH_WIRE_BYTES];
    for (int k = AUTH_HELLO_BYTES; k < AUTH_WIRE_BYTES; k++) {
        side i, r;
        through_relay(&i, &r, transcript, k, -1);
        if (r.rc == 0 || !strstr(r.err.msg, AUTH_WRONG_SECRET))
            fail_msg("byte %d of the initiator's proof flipped: the responder %s", k - AUTH_HELLO_BYTES,
                     r.rc ? r.err.msg : "passed it");
        through_relay(&i, &r, transcript, -1, k);
        if (i.rc == 0 || !strstr(i.err.msg, AUTH_WRONG_SECRET))
            fail_msg("byte %d of the responder's proof flipped: the initiator %s", k - AUTH_HELLO_BYTES,
                     i.rc ? i.err.msg : "passed it");
    }
}

static void test_empty_secret_refused(void **state) {
    (void)state;
    errbuf err = {""};
    assert_int_not_equal(auth_handshake(-1, secret_a, 0, 1, "x", clock_now_s() + 1, &err), 0);
    assert_non_null(strstr(err.msg, "secret is empty"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_right_secret_passes),
        cmocka_unit_test(test_wrong_secret_fails_both_sides),
        cmocka_unit_test(test_other_context_fails),
        cmocka_unit_test(test_bad_peers_fail_fast),
        cmocka_unit_test(test_silent_peer_times_out),
        cmocka_unit_test(test_replayed_session_fails),
        cmocka_unit_test(test_reflection_fails),
        cmocka_unit_test(test_every_proof_byte_counts),
        cmocka_unit_test(test_empty_secret_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
