/* auth: mutual challenge-response over a connected stream socket, proving that both ends
 * know a shared secret (the job secret) without the secret ever travelling.
 *
 * Each side sends  magic[8] nonce[32]  (a fresh random nonce), and once it has the peer's
 * nonce,  proof[32] = HMAC-SHA256(secret, "fsdp-auth-v1" role len(context) context
 * own_nonce peer_nonce)  where role is 'I' for the initiator and 'R' for the responder.
 * Each checks the peer's proof in constant time.  The role makes the two directions'
 * proofs differ (a peer reflecting our own bytes back fails), the fresh nonces make a
 * recorded session useless later, and the context binds a proof to one use ("fsdp-comm
 * ring", "fsdp-daemon"), so a proof made for one cannot be replayed to the other.
 * Nothing here encrypts: it keeps strangers and other jobs out, not an eavesdropper. */
#ifndef FSDP_AUTH_H
#define FSDP_AUTH_H

#include <stddef.h>

#include "base/errbuf.h"
#include "base/sha256.h"

#define AUTH_NONCE_BYTES 32
#define AUTH_HELLO_BYTES (8 + AUTH_NONCE_BYTES)           /* magic, nonce */
#define AUTH_WIRE_BYTES (AUTH_HELLO_BYTES + SHA256_BYTES) /* what each side sends in all */

/* The peer's proof did not verify: the message auth_step and auth_handshake give then. */
#define AUTH_WRONG_SECRET "peer does not know the job secret"

/* One side of a handshake in progress, for callers that drive many sockets from one poll()
 * loop.  secret and context are not copied: they must outlive the session. */
typedef struct auth_session {
    const unsigned char *secret;
    size_t secret_len;
    const char *context;
    int initiator;
    unsigned char nonce[AUTH_NONCE_BYTES];
    unsigned char out[AUTH_WIRE_BYTES];
    size_t out_len, sent; /* queued and sent bytes of out */
    unsigned char in[AUTH_WIRE_BYTES];
    size_t got; /* received bytes of in */
    int verified;
} auth_session;

/* Draws the nonce (getrandom) and queues our hello.  initiator: 1 on the side that made the
 * connection, 0 on the side that accepted it. */
int auth_start(auth_session *a, const unsigned char *secret, size_t secret_len, int initiator,
               const char *context, errbuf *err);
/* Sends and receives what the socket allows without blocking (MSG_DONTWAIT, so fd may be
 * blocking or not) and never reads past the handshake's last byte.  Returns 1 once the peer
 * has proved the secret and our proof is sent, 0 when it must be called again after poll()
 * reports auth_events(a), -1 with a message (AUTH_WRONG_SECRET for a wrong proof). */
int auth_step(auth_session *a, int fd, errbuf *err);
/* The poll() events auth_step waits for (POLLIN and/or POLLOUT). */
short auth_events(const auth_session *a);

/* The whole handshake on fd, by deadline_s (a clock_now_s() value); EINTR is retried.
 * 0 when the peer proved the secret, -1 with a message otherwise. */
int auth_handshake(int fd, const unsigned char *secret, size_t secret_len, int initiator,
                   const char *context, double deadline_s, errbuf *err);

#endif
