/* status_server: a running job's status socket (the protocol and the path are in
 * proto/status.h), served on fsdpd's libevent loop.
 *
 * Every connection is a non-blocking bufferevent, so a slow or stalled client never holds
 * up the loop.  A client must be the daemon's own user (SO_PEERCRED); another uid gets
 * {"ok":false,"error":"permission denied ..."} and is disconnected.  A client has
 * STATUS_REQUEST_TIMEOUT_S seconds from connecting, and again from each reply, to send a
 * complete request line, else it is dropped; a line longer than STATUS_LINE_MAX gets an error
 * and the connection is closed; a malformed line gets an error and the connection stays.  At
 * most STATUS_CLIENTS_MAX clients at once: one more is told so and closed.
 *
 * The socket is created mode 0600 (the directory decides who may even reach it).  A socket
 * file already at the path is replaced when nothing answers on it (a daemon that died), and
 * is an error when another process serves it.  status_server_free closes every connection
 * and removes the socket file (when it is still the one this server made). */
#ifndef FSDP_STATUS_SERVER_H
#define FSDP_STATUS_SERVER_H

#include <event2/event.h>
#include <jansson.h>

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/status.h"

#define STATUS_REQUEST_TIMEOUT_S 5
#define STATUS_CLIENTS_MAX 64

/* Answers one well-formed request: returns the reply's members (a new object; the server
 * adds "ok": true and "cmd"), or NULL with err filled, which becomes {"ok":false,"error"}. */
typedef json_t *(*status_handler)(void *arg, status_cmd cmd, errbuf *err);

typedef struct status_server_options {
    struct event_base *base;
    const char *path;      /* the socket file */
    status_handler handle;
    void *arg;
    int timeout_ms;        /* 0: STATUS_REQUEST_TIMEOUT_S seconds */
} status_server_options;

typedef struct status_server status_server;

int status_server_new(status_server **out, const status_server_options *opt, errbuf *err);
void status_server_free(status_server *s);
const char *status_server_path(const status_server *s);

/* What fsdpd's server asks of the job it serves (the supervisor answers; the server knows
 * nothing else of it). */
typedef struct status_job_hooks {
    void *arg;
    /* Sets "state" (setup, training, stopping), "stop_requested", "ranks" ([{"rank", "pid",
     * "running", "mem_bytes"}]), "metrics" (rank 0's last METRICS, or null), "last_error" and
     * "fabric" as members of out. */
    void (*status)(void *arg, json_t *out);
    /* A checkpoint at the next step boundary: the request's id, 0 when not training,
     * STATUS_REQUEST_FORWARDED when asked of the leader (another node's coordinator). */
    long long (*request_checkpoint)(void *arg, const char *why);
    /* A graceful stop: the checkpoint request it waits for, 0 when it stopped at once (not
     * training), -1 when the job is already stopping, STATUS_REQUEST_FORWARDED as above. */
    long long (*request_stop)(void *arg, const char *why);
} status_job_hooks;
#define STATUS_REQUEST_FORWARDED (-2LL)

/* The supervisor's rank rows ({"rank", "pid", "running", "mem_bytes"}) as status shows
 * them: with their host memory (VmRSS of /proc/PID/status) and, on the CUDA backend, the
 * device memory each last reported (its allocations: fsdp's shards, buffers and
 * activations; not the CUDA runtime's own) as "gpu_bytes".  A row that already has
 * "host_rss_bytes" (another node's, made there) is kept as it is.  A new array. */
json_t *status_rank_rows(const json_t *ranks, int cuda);

/* fsdpd's server: the socket of this job and node (runtime.status_socket, or the default
 * path of proto/status.h from the environment), logged as "status socket PATH", answering
 * from the supervisor:
 *   status      {"job": {"id", "node", "restart", "pid"}, "state", "stop_requested", "step",
 *                "total_steps", "loss", "lr", "grad_norm", "tokens_per_s", "eta_s",
 *                "tokens_seen" (the numbers of rank 0's last step, null before the first),
 *                "ranks": [{"rank", "pid", "running", "host_rss_bytes" (VmRSS of
 *                /proc/PID/status), "gpu_bytes" (CUDA: the device memory its
 *                allocations held at its last heartbeat; null on the CPU backend and
 *                before the first report), "progress" (once training has begun: {"work":
 *                units of training done, "step", "still_s": seconds since "work" last
 *                moved, what runtime.stall_timeout_s is held against})}],
 *                "checkpoint": {"dir", "last": {"step", "path"} or null, "in_flight":
 *                [{"step", "path"}]}, "restarts", "last_error", "backend", "fabric"
 *                ("nccl" or "tcp": how the workers were connected; "none" for one worker; null before), "socket"}
 *   checkpoint  hooks->request_checkpoint: {"request": id, "message"}
 *   stop        hooks->request_stop: {"checkpoint_request": id or null, "message"}
 * job (the supervisor's resolved copy) must outlive the server. */
int status_server_open(status_server **out, struct event_base *base, const status_job_hooks *hooks,
                       const job_config *job, int node, errbuf *err);

#endif
