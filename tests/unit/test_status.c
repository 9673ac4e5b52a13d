/* Unit tests for proto/status (requests, replies, socket names and paths) and
 * daemon/status_server (a server on a libevent loop in a thread, with a fake handler):
 * answers, errors that keep the connection, oversized lines, half-sent and stalled clients
 * that are dropped while others are served, too many clients, a stale socket replaced, a
 * live one kept, the file's mode and removal, another uid refused (as root).
 *
 * Run with arguments, the binary is instead one of the integration test's clients:
 *   test_status --send PATH TEXT   sends TEXT, shuts down its writing, prints every reply
 *                                  byte until the server closes (exit 1 after 10 s);
 *   test_status --stall PATH TEXT  sends TEXT (half a request) and waits for the server to
 *                                  drop it; prints "dropped after S s" (exit 1 after 30 s). */
#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/thread.h>

#include "base/clock.h"
#include "daemon/status_server.h"
#include "proto/status.h"

static void assert_contains(const char *msg, const char *part) {
    if (!strstr(msg, part)) fail_msg("message \"%s\" lacks \"%s\"", msg, part);
}

/* ---- requests and replies ---- */

static int parse(const char *line, status_cmd *cmd, errbuf *err) {
    return status_request_parse(line, strlen(line), cmd, err);
}

static void test_requests(void **state) {
    (void)state;
    status_cmd cmd = STATUS_CMD_STOP;
    errbuf err = {""};
    assert_int_equal(parse("{\"cmd\":\"status\"}\n", &cmd, &err), 0);
    assert_int_equal(cmd, STATUS_CMD_STATUS);
    assert_int_equal(parse(" { \"cmd\" : \"checkpoint\" } \r\n", &cmd, &err), 0);
    assert_int_equal(cmd, STATUS_CMD_CHECKPOINT);
    assert_int_equal(parse("{\"cmd\":\"stop\"}", &cmd, &err), 0);
    assert_int_equal(cmd, STATUS_CMD_STOP);
    assert_string_equal(status_cmd_name(STATUS_CMD_CHECKPOINT), "checkpoint");
}

static void expect_bad(const char *line, size_t len, const char *why) {
    status_cmd cmd = STATUS_CMD_STATUS;
    errbuf err = {""};
    assert_int_equal(status_request_parse(line, len, &cmd, &err), -1);
    assert_contains(err.msg, why);
    assert_int_equal(cmd, STATUS_CMD_STATUS); /* untouched */
}
#define EXPECT_BAD(lit, why) expect_bad(lit, sizeof lit - 1, why)

static void test_bad_requests(void **state) {
    (void)state;
    EXPECT_BAD("\n", "empty request");
    EXPECT_BAD("", "empty request");
    EXPECT_BAD("status\n", "not JSON");
    EXPECT_BAD("{\"cmd\":\"status\"} x\n", "not JSON");
    EXPECT_BAD("{\"cmd\":\"status\"}{\"cmd\":\"stop\"}\n", "not JSON");
    EXPECT_BAD("[\"status\"]\n", "the request is a list, not an object");
    EXPECT_BAD("\"status\"\n", "not JSON"); /* jansson wants an object or an array */
    EXPECT_BAD("{}\n", "no \"cmd\"");
    EXPECT_BAD("{\"cmd\":1}\n", "\"cmd\" is an integer, not a string");
    EXPECT_BAD("{\"cmd\":\"reboot\"}\n", "unknown command 'reboot' (status, checkpoint or stop)");
    EXPECT_BAD("{\"cmd\":\"status\\u0000x\"}\n", "not JSON");
    EXPECT_BAD("{\"cmd\":\"status\",\"why\":1}\n", "unknown key 'why'");
    EXPECT_BAD("{\"cmd\":\"status\",\"cmd\":\"stop\"}\n", "duplicate");
    EXPECT_BAD("{\"cmd\":\"st\0atus\"}\n", "NUL byte");
    EXPECT_BAD("{\"\\u001b[2J\":1}\n", "unknown key '?[2J'"); /* no terminal escapes in the log */

    /* The bound counts the '\n': 4096 bytes with it pass, one more does not. */
    char line[STATUS_LINE_MAX + 2];
    memset(line, ' ', sizeof line);
    memcpy(line, "{\"cmd\":\"status\"}", 16);
    line[STATUS_LINE_MAX - 1] = '\n';
    status_cmd cmd;
    errbuf err;
    assert_int_equal(status_request_parse(line, STATUS_LINE_MAX, &cmd, &err), 0);
    line[STATUS_LINE_MAX - 1] = ' ';
    line[STATUS_LINE_MAX] = '\n';
    expect_bad(line, STATUS_LINE_MAX + 1, "a request of 4097 bytes is longer than the 4096 allowed");
}

static void test_replies(void **state) {
    (void)state;
    json_t *r = NULL;
    errbuf err = {""};
    const char *ok = "{\"ok\":true,\"cmd\":\"status\",\"step\":3}";
    assert_int_equal(status_reply_parse(ok, strlen(ok), &r, &err), 0);
    assert_int_equal(json_integer_value(json_object_get(r, "step")), 3);
    json_decref(r);
    const char *no = "{\"ok\":false,\"error\":\"permission denied: uid 7\"}";
    assert_int_equal(status_reply_parse(no, strlen(no), &r, &err), -1);
    assert_string_equal(err.msg, "permission denied: uid 7");
    assert_int_equal(status_reply_parse("{\"ok\":false}", 12, &r, &err), -1);
    assert_contains(err.msg, "without saying why");
    assert_int_equal(status_reply_parse("{\"step\":1}", 10, &r, &err), -1);
    assert_contains(err.msg, "no \"ok\"");
    assert_int_equal(status_reply_parse("[1]", 3, &r, &err), -1);
    assert_contains(err.msg, "a list, not an object");
    assert_int_equal(status_reply_parse("{\"ok\":tru", 9, &r, &err), -1);
    assert_contains(err.msg, "not JSON");
    /* a follower's forwarded checkpoint or stop: the leader's request id is not known (null) */
    json_t *fwd = json_pack("{s:b, s:n, s:s}", "ok", 1, "request", "message", "checkpoint requested from the leader");
    assert_int_equal(status_reply_check(STATUS_CMD_CHECKPOINT, fwd, &err), 0);
    json_object_set_new(fwd, "request", json_string("7"));
    assert_int_equal(status_reply_check(STATUS_CMD_CHECKPOINT, fwd, &err), -1);
    assert_contains(err.msg, "'request' is a string, not an integer");
    json_decref(fwd);
    fwd = json_pack("{s:b, s:n, s:s}", "ok", 1, "checkpoint_request", "message", "stopping: asked the leader");
    assert_int_equal(status_reply_check(STATUS_CMD_STOP, fwd, &err), 0);
    json_decref(fwd);
}

/* ---- socket names and places ---- */

static void test_job_ids_and_dirs(void **state) {
    (void)state;
    assert_true(status_job_id_valid("12345"));
    assert_true(status_job_id_valid("local-77"));
    assert_true(status_job_id_valid("123_4.x"));
    assert_false(status_job_id_valid(""));
    assert_false(status_job_id_valid("../etc"));
    assert_false(status_job_id_valid("a/b"));
    assert_false(status_job_id_valid(".hidden"));
    assert_false(status_job_id_valid("-r0"));
    assert_false(status_job_id_valid("a b"));
    char long_id[STATUS_JOB_ID_MAX + 1];
    memset(long_id, '7', sizeof long_id - 1);
    long_id[STATUS_JOB_ID_MAX] = '\0';
    assert_false(status_job_id_valid(long_id));
    long_id[STATUS_JOB_ID_MAX - 1] = '\0';
    assert_true(status_job_id_valid(long_id));

    char dir[64];
    errbuf e;
    static const struct { int slurm; const char *xdg, *tmp, *want; } cases[] = {
        {0, "/run/user/5", "/scratch", "/run/user/5"}, {1, "/run/user/5", "/scratch", "/scratch/fsdpd-5"}, /* SLURM */
        {0, "", "/scratch", "/scratch/fsdpd-5"},      {0, NULL, NULL, "/tmp/fsdpd-5"},
        {1, "/run/user/5", "", "/tmp/fsdpd-5"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(status_socket_dir(dir, sizeof dir, cases[i].slurm, cases[i].xdg, cases[i].tmp, 5, &e), 0);
        assert_string_equal(dir, cases[i].want);
    }
    assert_int_equal(status_socket_dir(dir, 8, 0, NULL, "/scratch", 5, &e), -1);
}

static void test_socket_paths(void **state) {
    (void)state;
    char path[STATUS_SOCKET_MAX], id[STATUS_JOB_ID_MAX];
    errbuf err = {""};
    int restart = -1, node = -1;
    assert_int_equal(status_socket_path(path, sizeof path, "/tmp", "local-42", 3, 1, &err), 0);
    assert_string_equal(path, "/tmp/fsdpd-local-42-r3-n1.sock");
    assert_int_equal(status_socket_name_parse("fsdpd-local-42-r3-n1.sock", id, &restart, &node), 1);
    assert_string_equal(id, "local-42");
    assert_int_equal(restart, 3);
    assert_int_equal(node, 1);
    /* A job id that itself looks like the suffix. */
    assert_int_equal(status_socket_name_parse("fsdpd-a-r1-n2-r10-n0.sock", id, &restart, &node), 1);
    assert_string_equal(id, "a-r1-n2");
    assert_int_equal(restart, 10);
    assert_int_equal(node, 0);

    const char *not_ours[] = {"fsdpd-1-r0-n0.socket", "fsdp-1-r0-n0.sock", "fsdpd--r0-n0.sock",
                              "fsdpd-1-r-n0.sock", "fsdpd-1-r0-n.sock", "fsdpd-1-r0.sock",
                              "fsdpd-1-n0-r0.sock", "fsdpd-1-rx-n0.sock", "fsdpd-.x-r0-n0.sock",
                              "fsdpd-1-r0-n0x.sock", "fsdpd-1-r9999999999-n0.sock", "fsdpd-1-r01-n0.sock",
                              "fsdpd-1-r0-n00.sock", "fsdpd-.sock", ""};
    for (size_t i = 0; i < sizeof not_ours / sizeof not_ours[0]; i++)
        if (status_socket_name_parse(not_ours[i], id, &restart, &node))
            fail_msg("'%s' parsed as a socket name", not_ours[i]);

    assert_int_equal(status_socket_path(path, sizeof path, "/tmp", "../x", 0, 0, &err), -1);
    assert_contains(err.msg, "job id '../x' cannot name a socket");
    char dir[120];
    memset(dir, 'd', sizeof dir - 1);
    dir[0] = '/';
    dir[sizeof dir - 1] = '\0';
    assert_int_equal(status_socket_path(path, sizeof path, dir, "1", 0, 0, &err), -1);
    assert_contains(err.msg, "longer than the 107 bytes a Unix socket allows (set runtime.status_socket)");
}

static void test_place_from_env(void **state) {
    (void)state;
    status_place p;
    errbuf err = {""};
    setenv("SLURM_JOB_ID", "9876", 1);
    setenv("SLURM_RESTART_COUNT", "2", 1);
    setenv("XDG_RUNTIME_DIR", "/run/user/1", 1);
    setenv("TMPDIR", "/scratch/t", 1);
    assert_int_equal(status_place_from_env(&p, &err), 0);
    assert_true(p.under_slurm);
    assert_string_equal(p.job_id, "9876");
    assert_int_equal(p.restart, 2);
    char want[64];
    snprintf(want, sizeof want, "/scratch/t/fsdpd-%u", (unsigned)geteuid());
    assert_string_equal(p.dir, want);

    setenv("SLURM_RESTART_COUNT", "two", 1);
    assert_int_equal(status_place_from_env(&p, &err), -1);
    assert_contains(err.msg, "SLURM_RESTART_COUNT 'two' is not a count");
    setenv("SLURM_JOB_ID", "1;rm", 1);
    assert_int_equal(status_place_from_env(&p, &err), -1);
    assert_contains(err.msg, "SLURM_JOB_ID '1;rm' is not a job id");

    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_RESTART_COUNT");
    assert_int_equal(status_place_from_env(&p, &err), 0);
    snprintf(want, sizeof want, "local-%d", (int)getpid());
    assert_string_equal(p.job_id, want);
    assert_int_equal(p.restart, 0);
    assert_string_equal(p.dir, "/run/user/1");
    unsetenv("XDG_RUNTIME_DIR");
    unsetenv("TMPDIR");
}

/* ---- the server ---- */

typedef struct fixture {
    char dir[64], path[96];
    struct event_base *base;
    status_server *server;
    pthread_t loop;
    struct event *poll_quit;
    atomic_int calls, quit;
} fixture;

/* status: {"calls": n}; checkpoint: an error from the handler; stop: the same as status. */
static json_t *fake_handle(void *arg, status_cmd cmd, errbuf *err) {
    fixture *f = arg;
    int n = atomic_fetch_add(&f->calls, 1) + 1;
    if (cmd == STATUS_CMD_CHECKPOINT) {
        errf(err, "the job is not training");
        return NULL;
    }
    return json_pack("{s:i}", "calls", n);
}

/* The loop runs in its own thread and leaves when the test sets `quit`. */
static void check_quit(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    fixture *f = arg;
    if (atomic_load(&f->quit)) event_base_loopbreak(f->base);
}

static void *run_loop(void *arg) {
    fixture *f = arg;
    event_base_loop(f->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static int start_server(fixture *f, errbuf *err) {
    status_server_options opt = {.base = f->base, .path = f->path, .handle = fake_handle, .arg = f,
                                 .timeout_ms = 1000};
    return status_server_new(&f->server, &opt, err);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/test_status.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/s.sock", f->dir);
    f->base = event_base_new();
    assert_non_null(f->base);
    errbuf err = {""};
    if (start_server(f, &err)) fail_msg("%s", err.msg);
    struct timeval every = {0, 20000};
    f->poll_quit = event_new(f->base, -1, EV_PERSIST, check_quit, f);
    assert_non_null(f->poll_quit);
    assert_int_equal(event_add(f->poll_quit, &every), 0);
    assert_int_equal(pthread_create(&f->loop, NULL, run_loop, f), 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    atomic_store(&f->quit, 1);
    pthread_join(f->loop, NULL);
    event_free(f->poll_quit);
    status_server_free(f->server);
    event_base_free(f->base);
    unlink(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

/* A blocking client whose reads give up after 3 s. */
static int client(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    struct timeval tv = {3, 0};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        fail_msg("connect %s: %s", path, strerror(errno));
    return fd;
}

static void send_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n <= 0) fail_msg("send: %s", strerror(errno));
        data += n;
        len -= (size_t)n;
    }
}
#define SEND(fd, lit) send_all(fd, lit, sizeof lit - 1)

/* One reply line (without '\n'); "" when the server closed or nothing came within 3 s. */
static const char *read_line(int fd, char *buf, size_t cap) {
    size_t n = 0;
    char ch;
    while (n + 1 < cap && recv(fd, &ch, 1, 0) == 1 && ch != '\n') buf[n++] = ch;
    buf[n] = '\0';
    return buf;
}

/* Seconds until the server closes the connection (recv gives 0 or a reset), -1 after 3 s. */
static double seconds_to_close(int fd) {
    double t0 = clock_now_s();
    char buf[256];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return clock_now_s() - t0;
        if (n < 0) return -1;
    }
}

static void test_serves_requests(void **state) {
    fixture *f = *state;
    char line[512];
    int fd = client(f->path);
    SEND(fd, "{\"cmd\":\"status\"}\n");
    assert_string_equal(read_line(fd, line, sizeof line), "{\"ok\":true,\"cmd\":\"status\",\"calls\":1}");
    /* A handler's error, then garbage: error replies, and the connection stays. */
    SEND(fd, "{\"cmd\":\"checkpoint\"}\n");
    assert_string_equal(read_line(fd, line, sizeof line), "{\"ok\":false,\"error\":\"the job is not training\"}");
    SEND(fd, "\x01\x02garbage\xff\n");
    assert_contains(read_line(fd, line, sizeof line), "{\"ok\":false,\"error\":\"the request is not JSON");
    SEND(fd, "{\"cmd\":\"halt\"}\n");
    assert_contains(read_line(fd, line, sizeof line), "unknown command 'halt'");
    /* Three requests in one write, the last one split across two. */
    SEND(fd, "{\"cmd\":\"status\"}\n{\"cmd\":\"stop\"}\n{\"cmd\":");
    SEND(fd, "\"status\"}\n");
    assert_string_equal(read_line(fd, line, sizeof line), "{\"ok\":true,\"cmd\":\"status\",\"calls\":3}");
    assert_string_equal(read_line(fd, line, sizeof line), "{\"ok\":true,\"cmd\":\"stop\",\"calls\":4}");
    assert_string_equal(read_line(fd, line, sizeof line), "{\"ok\":true,\"cmd\":\"status\",\"calls\":5}");
    close(fd);

    /* A last request without its '\n', then the client shuts down its writing. */
    fd = client(f->path);
    SEND(fd, "{\"cmd\":\"status\"}");
    shutdown(fd, SHUT_WR);
    assert_string_equal(read_line(fd, line, sizeof line), "{\"ok\":true,\"cmd\":\"status\",\"calls\":6}");
    assert_true(seconds_to_close(fd) >= 0);
    close(fd);

    struct stat st;
    assert_int_equal(stat(f->path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
}

static void test_oversized_request(void **state) {
    fixture *f = *state;
    char line[512], big[3 * STATUS_LINE_MAX];
    memset(big, 'x', sizeof big);
    int fd = client(f->path);
    send_all(fd, big, sizeof big);
    assert_string_equal(read_line(fd, line, sizeof line),
                        "{\"ok\":false,\"error\":\"a request line is at most 4096 bytes: closing the connection\"}");
    assert_true(seconds_to_close(fd) >= 0);
    close(fd);
    /* Exactly 4097 bytes with its '\n' is one too many. */
    memset(big, ' ', STATUS_LINE_MAX);
    big[STATUS_LINE_MAX] = '\n';
    fd = client(f->path);
    send_all(fd, big, STATUS_LINE_MAX + 1);
    assert_contains(read_line(fd, line, sizeof line), "at most 4096 bytes");
    close(fd);
    /* The server goes on. */
    fd = client(f->path);
    SEND(fd, "{\"cmd\":\"status\"}\n");
    assert_contains(read_line(fd, line, sizeof line), "\"ok\":true");
    close(fd);
}

/* Stalled clients (half a request, or nothing) are dropped after the timeout, and others are
 * answered at once meanwhile. */
static void test_stalled_clients(void **state) {
    fixture *f = *state;
    enum { STALLED = 20 };
    int stalled[STALLED];
    char line[512];
    for (int i = 0; i < STALLED; i++) {
        stalled[i] = client(f->path);
        if (i % 2) SEND(stalled[i], "{\"cmd\":\"sta");
    }
    double t0 = clock_now_s();
    int fd = client(f->path);
    SEND(fd, "{\"cmd\":\"status\"}\n");
    assert_contains(read_line(fd, line, sizeof line), "\"ok\":true");
    /* Answered while every stalled client is still connected. */
    for (int i = 0; i < STALLED; i++) {
        char byte;
        assert_int_equal(recv(stalled[i], &byte, 1, MSG_DONTWAIT), -1);
        assert_int_equal(errno, EAGAIN);
    }
    for (int i = 0; i < STALLED; i++) {
        double s = seconds_to_close(stalled[i]);
        if (s < 0) fail_msg("stalled client %d was not dropped", i);
        close(stalled[i]);
    }
    double waited = clock_now_s() - t0;
    assert_true(waited >= 0.9 && waited < 5.0); /* the timeout is 1 s */
    /* The answered client got its own deadline again: it is dropped too when idle. */
    assert_true(seconds_to_close(fd) >= 0);
    close(fd);
}

static void test_too_many_clients(void **state) {
    fixture *f = *state;
    int fds[STATUS_CLIENTS_MAX];
    char line[512];
    for (int i = 0; i < STATUS_CLIENTS_MAX; i++) fds[i] = client(f->path);
    /* Let the server accept them all before the next one comes. */
    SEND(fds[STATUS_CLIENTS_MAX - 1], "{\"cmd\":\"status\"}\n");
    assert_contains(read_line(fds[STATUS_CLIENTS_MAX - 1], line, sizeof line), "\"ok\":true");
    int extra = client(f->path);
    assert_contains(read_line(extra, line, sizeof line), "too many status clients at once");
    close(extra);
    for (int i = 0; i < STATUS_CLIENTS_MAX; i++) close(fds[i]);
    /* Once they are gone, new clients are served. */
    for (int tries = 0; tries < 50; tries++) {
        int fd = client(f->path);
        SEND(fd, "{\"cmd\":\"status\"}\n");
        int ok = strstr(read_line(fd, line, sizeof line), "\"ok\":true") != NULL;
        close(fd);
        if (ok) return;
        usleep(20000);
    }
    fail_msg("no client served after the crowd left: %s", line);
}

/* Another uid reaches the socket (mode 0666 for the test) and is refused by the server. */
static void test_other_uid_refused(void **state) {
    fixture *f = *state;
    if (geteuid() != 0) {
        print_message("not root: cannot connect as another uid\n");
        skip();
    }
    assert_int_equal(chmod(f->dir, 0711), 0);
    assert_int_equal(chmod(f->path, 0666), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", f->path);
        struct timeval tv = {3, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) _exit(4);
        send(fd, "{\"cmd\":\"stop\"}\n", 15, MSG_NOSIGNAL);
        char line[512];
        read_line(fd, line, sizeof line);
        _exit(strstr(line, "permission denied: uid 65534 is not the job's owner (uid 0)") ? 0 : 5);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(atomic_load(&f->calls), 0); /* the handler never ran */
}

/* A socket file left by a dead server is replaced; a live one, or a file that is not a
 * socket, is an error; the socket file goes with the server. */
static void test_socket_file(void **state) {
    fixture *f = *state;
    fixture other = {.base = f->base};
    errbuf err = {""};
    memcpy(other.path, f->path, sizeof other.path);
    assert_int_equal(start_server(&other, &err), -1);
    assert_contains(err.msg, "another process serves this status socket");

    /* A stale socket: bound, then its owner gone. */
    snprintf(other.path, sizeof other.path, "%s/stale.sock", f->dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", other.path);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    close(fd);
    if (start_server(&other, &err)) fail_msg("%s", err.msg);
    struct stat st;
    assert_int_equal(stat(other.path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    status_server_free(other.server);
    assert_int_equal(stat(other.path, &st), -1);

    /* A regular file is not ours to remove. */
    FILE *file = fopen(other.path, "w");
    assert_non_null(file);
    fclose(file);
    assert_int_equal(start_server(&other, &err), -1);
    assert_contains(err.msg, "exists and is not a socket");
    assert_int_equal(unlink(other.path), 0);
}

/* ---- helper modes for tests/integration/test_status.sh ---- */

static int raw_connect(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "test_status: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return fd;
}

static int helper_send(const char *path, const char *text) {
    int fd = raw_connect(path);
    if (fd < 0) return 1;
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t sent = send(fd, text, strlen(text), MSG_NOSIGNAL);
    (void)sent; /* the server may close first (a line too long): its reply is still there */
    shutdown(fd, SHUT_WR);
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) fwrite(buf, 1, (size_t)n, stdout);
    close(fd);
    return n == 0 || (n < 0 && errno == ECONNRESET) ? 0 : 1;
}

static int helper_stall(const char *path, const char *text) {
    int fd = raw_connect(path);
    if (fd < 0) return 1;
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    double t0 = clock_now_s();
    send(fd, text, strlen(text), MSG_NOSIGNAL);
    double s = seconds_to_close(fd);
    close(fd);
    if (s < 0) {
        printf("not dropped after %.1f s\n", clock_now_s() - t0);
        return 1;
    }
    printf("dropped after %.1f s\n", s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--send")) return helper_send(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "--stall")) return helper_stall(argv[2], argv[3]);
    evthread_use_pthreads();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_replies),
        cmocka_unit_test(test_job_ids_and_dirs),
        cmocka_unit_test(test_socket_paths),
        cmocka_unit_test(test_place_from_env),
        cmocka_unit_test_setup_teardown(test_serves_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stalled_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_many_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_uid_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
