/* ctl: the control protocol between fsdpd and its workers (one socketpair each).
 *
 * A stream of frames.  Each frame is a 12-byte header, all little-endian:
 *
 *     offset 0  magic    4 bytes "FSDP"
 *     offset 4  version  u16 (CTL_VERSION)
 *     offset 6  type     u16 (ctl_type)
 *     offset 8  length   u32 body bytes, at most CTL_MAX_BODY
 *
 * then the body: JSON text (an object) for every type but NCCL_ID, whose body is the raw
 * bytes of the NCCL unique id.  A bad magic, version, type or length makes the whole stream
 * invalid: the reader drops the peer, it never tries to resynchronise.
 *
 * The daemon reads with the incremental decoder (fed whatever bytes libevent hands it);
 * the worker uses the blocking ctl_send / ctl_recv. */
#ifndef FSDP_CTL_H
#define FSDP_CTL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "errbuf.h"

#define CTL_MAGIC "FSDP"
#define CTL_VERSION 1
#define CTL_HEADER_SIZE 12
#define CTL_MAX_BODY (16u << 20) /* enough for a CONFIG or a rank table */

/* w = worker, d = daemon.  The numbers are on the wire: new types go at the end. */
typedef enum ctl_type {
    CTL_HELLO = 1,       /* w->d: first message: who the worker is (rank, pid, device) */
    CTL_CONFIG = 2,      /* d->w: the resolved job (job_to_json) and the worker's place in it */
    CTL_NCCL_ID = 3,     /* w->d from global rank 0, then d->w: the NCCL unique id (raw bytes) */
    CTL_START = 4,       /* d->w: begin training */
    CTL_HEARTBEAT = 5,   /* w->d: still alive (and where it is) */
    CTL_METRICS = 6,     /* w->d: step, loss, learning rate, throughput, ... */
    CTL_CKPT_BEGIN = 7,  /* d->w: save a checkpoint (step, directory) */
    CTL_CKPT_DONE = 8,   /* w->d: shard written and fsynced (file, size, checksum) */
    CTL_CKPT_ABORT = 9,  /* d->w: abandon the checkpoint in progress */
    CTL_STOP = 10,       /* d->w: stop (reason) */
    CTL_FATAL = 11,      /* w->d: the worker cannot go on (message) */
    CTL_ADDR = 12,       /* w->d: the address the worker listens on, for the rank table */
    CTL_PEERS = 13,      /* d->w: the rank table (every rank's address) */
    CTL_TYPE_END         /* one past the last type */
} ctl_type;

/* "HELLO", ...; "UNKNOWN" for a value that is not a type. */
const char *ctl_type_name(int type);

/* One message.  body is malloc'd and NUL-terminated (body[len] == 0) so JSON bodies can be
 * parsed in place; ctl_msg_free releases it. */
typedef struct ctl_msg {
    ctl_type type;
    uint32_t len;
    char *body;
} ctl_msg;

void ctl_msg_free(ctl_msg *m);

/* Writes the header of a frame whose body is body_len bytes; the body follows it unchanged. */
int ctl_encode_header(uint8_t header[CTL_HEADER_SIZE], int type, size_t body_len, errbuf *err);
/* Writes a whole frame (header + body) into buf, which holds cap bytes; *frame_len is set to
 * CTL_HEADER_SIZE + len. */
int ctl_encode(int type, const void *body, size_t len, void *buf, size_t cap, size_t *frame_len,
               errbuf *err);

/* Incremental reader for a non-blocking socket.  Feed it bytes as they arrive and take
 * whole messages out with ctl_decoder_next until it returns 0.  Once it has returned -1 the
 * stream is broken and it keeps returning -1. */
typedef struct ctl_decoder {
    uint8_t *buf;
    size_t start, end, cap; /* unread bytes are buf[start, end) */
    int broken;             /* why is in `error` */
    errbuf error;
} ctl_decoder;

void ctl_decoder_init(ctl_decoder *d);
void ctl_decoder_free(ctl_decoder *d);
/* Appends bytes (copied); fails only when out of memory.  Bytes fed to a broken stream are
 * dropped. */
int ctl_decoder_feed(ctl_decoder *d, const void *data, size_t len, errbuf *err);
/* 1: *out holds the next message (the caller frees it with ctl_msg_free); 0: more bytes are
 * needed; -1: the stream is malformed (bad magic, version, type or length). */
int ctl_decoder_next(ctl_decoder *d, ctl_msg *out, errbuf *err);
/* Bytes received but not yet returned as a message (non-zero at EOF: a truncated frame). */
size_t ctl_decoder_buffered(const ctl_decoder *d);

/* Blocking helpers for the worker.  ctl_send writes the whole frame (retrying partial
 * writes and EINTR; MSG_NOSIGNAL, so a closed peer is an error, not SIGPIPE).  ctl_recv
 * reads exactly one frame; timeout_ms < 0 waits forever.  The end of the stream is the
 * error "peer closed". */
int ctl_send(int fd, int type, const void *body, size_t len, errbuf *err);
int ctl_recv(int fd, ctl_msg *out, int timeout_ms, errbuf *err);

/* Sends a JSON value as the body (compact text). */
int ctl_send_json(int fd, int type, const json_t *body, errbuf *err);
/* Parses a message's body, which must be a JSON object; *out is a new reference. */
int ctl_msg_json(const ctl_msg *m, json_t **out, errbuf *err);

#endif
