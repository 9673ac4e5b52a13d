/* status: the protocol of a running job's status socket (DESIGN.md, Control and status
 * protocols) and where that socket lives.  fsdpd serves it (daemon/status_server.h),
 * `fsdpctl status|checkpoint|stop` is its client.
 *
 * A Unix stream socket per job and node speaking JSON lines.  A request is one line of at
 * most STATUS_LINE_MAX bytes (its '\n' included), a JSON object with one key:
 *     {"cmd":"status"}      the job's state and numbers
 *     {"cmd":"checkpoint"}  request a checkpoint at the next step boundary
 *     {"cmd":"stop"}        graceful stop: a checkpoint, then the workers stop
 * Each request gets one reply line: {"ok":true,"cmd":...,...} or {"ok":false,"error":"..."}.
 * A connection may carry several requests, one after the other.
 *
 * The socket path: runtime.status_socket when the job sets it, else
 *     DIR/fsdpd-JOBID-rRESTART-nNODE.sock
 * JOBID is SLURM_JOB_ID (or "local-PID" outside SLURM), RESTART is SLURM_RESTART_COUNT (0
 * when unset), NODE the node index.  DIR is $XDG_RUNTIME_DIR outside SLURM when it is set
 * (under SLURM it belongs to the login host), else fsdpd-UID in $TMPDIR, else in /tmp: a
 * directory of the user's own (0700, made and checked by fsdpd, checked by fsdpctl), so no
 * other user can take a job's socket name first or serve a socket in its place. */
#ifndef FSDP_STATUS_H
#define FSDP_STATUS_H

#include <stddef.h>

#include <jansson.h>

#include "base/errbuf.h"
#include "proto/job.h"

#define STATUS_LINE_MAX 4096            /* a request line, '\n' included */
#define STATUS_JOB_ID_MAX 64            /* a job id, NUL included */
#define STATUS_SOCKET_MAX JOB_SOCKET_PATH_MAX /* sizeof(sockaddr_un.sun_path) */

typedef enum status_cmd { STATUS_CMD_STATUS, STATUS_CMD_CHECKPOINT, STATUS_CMD_STOP } status_cmd;

/* "status", "checkpoint", "stop". */
const char *status_cmd_name(status_cmd cmd);

/* Parses one request line (the trailing '\n' or "\r\n" may be left on or off).  A line that
 * is too long, holds a NUL byte, is not a JSON object, or whose object is not exactly
 * {"cmd": one of the commands} is an error saying what is wrong. */
int status_request_parse(const char *line, size_t len, status_cmd *cmd, errbuf *err);

/* Parses one reply line into *reply (a new reference, "ok" true).  A reply with "ok" false
 * is an error carrying its "error" text; anything else that is not such an object is an
 * error saying so. */
int status_reply_parse(const char *line, size_t len, json_t **reply, errbuf *err);

/* Checks every field fsdpctl prints of a reply to cmd, with its JSON kind ("field
 * 'job.id' is missing", "field 'ranks[2].pid' is a string, not an integer"); members it
 * does not print are free.  A status reply: job {id, node, restart, pid}, state,
 * stop_requested, step / total_steps (integers or null), loss / lr / grad_norm /
 * tokens_per_s / eta_s (numbers or null), eval ({loss, step} or null), checkpoint {dir,
 * last ({step} or null), in_flight [{step}], failed_saves, last_save_error (string or
 * null)}, nodes (optional) [{node, role, host, connected, state, last_heard_s (number or
 * null)}], ranks [{rank, node (optional), pid, running, host_rss_bytes / gpu_bytes
 * (integers or null, optional)}], backend, fabric (string or null), restarts, last_error
 * (string or null).  A checkpoint or stop reply: message, request / checkpoint_request
 * (optional integers or null: a follower forwards the request and knows no id). */
int status_reply_check(status_cmd cmd, const json_t *reply, errbuf *err);

/* Whether `id` can name a job in a socket file name: 1 to STATUS_JOB_ID_MAX - 1 characters
 * from [A-Za-z0-9_.-], not starting with '.' or '-'. */
int status_job_id_valid(const char *id);

/* Where default sockets live (see above) into out: xdg_runtime_dir, or TMPDIR/fsdpd-UID
 * (tmpdir, else /tmp).  Empty strings count as unset; a path too long is an error. */
int status_socket_dir(char *out, size_t n, int under_slurm, const char *xdg_runtime_dir, const char *tmpdir,
                      unsigned uid, errbuf *err);

/* DIR/fsdpd-JOBID-rRESTART-nNODE.sock into out; an invalid job id, a negative number or a
 * path longer than a Unix socket address allows is an error. */
int status_socket_path(char *out, size_t n, const char *dir, const char *job_id, int restart,
                       int node, errbuf *err);

/* Reads a socket file name ("fsdpd-JOBID-rR-nN.sock", no directory).  Returns 1 and fills
 * the parts when it is one, 0 otherwise. */
int status_socket_name_parse(const char *name, char job_id[STATUS_JOB_ID_MAX], int *restart,
                             int *node);

/* The record a job's leader leaves beside the sockets, DIR/fsdpd-JOBID.output (0600), naming
 * its output directory, so that `fsdpctl status --job-id ID` finds the finished job's
 * OUTPUT_DIR/run.json once no socket answers.  Its content: the absolute output directory and
 * a newline, nothing else.  path: the record's path into out (an invalid job id or a path too
 * long is an error); parse: the directory of such text into out[n] (an empty, relative or
 * multi-line path, a NUL, or one too long is an error naming `name`). */
#define STATUS_OUTPUT_RECORD_MAX 8192
int status_output_record_path(char *out, size_t n, const char *dir, const char *job_id, errbuf *err);
int status_output_record_parse(const char *text, size_t len, char *out, size_t n, const char *name, errbuf *err);

/* Where this process's job is: the job id, restart count and socket directory from the
 * environment (SLURM_JOB_ID, SLURM_RESTART_COUNT, XDG_RUNTIME_DIR, TMPDIR).  A malformed
 * SLURM_JOB_ID or SLURM_RESTART_COUNT is an error naming it. */
typedef struct status_place {
    int under_slurm;
    char job_id[STATUS_JOB_ID_MAX]; /* SLURM_JOB_ID, or "local-PID" (this process's pid) */
    int restart;
    char dir[JOB_PATH_MAX];
} status_place;

int status_place_from_env(status_place *p, errbuf *err);

#endif
