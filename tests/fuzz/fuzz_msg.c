/* Fuzzes proto/msg: the first byte picks where the rest of the input is split into two
 * feeds, as a socket would deliver it; every frame is taken out and decoded as its typed
 * message, and a message that decodes must encode and decode again to the same JSON. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/msg.h"

static void round_trip(const msg *m) {
    uint8_t *frame;
    size_t len;
    errbuf err;
    if (msg_encode(m, &frame, &len, &err)) abort();
    msg_frame f = {m->type, (uint32_t)(len - MSG_HEADER_SIZE), NULL};
    f.body = malloc(f.len + 1);
    if (!f.body) abort();
    memcpy(f.body, frame + MSG_HEADER_SIZE, f.len);
    f.body[f.len] = '\0';
    msg back;
    if (msg_decode(&f, &back, &err)) abort();
    if (m->type != MSG_NCCL_ID) {
        json_t *a = msg_to_json(m, &err), *b = msg_to_json(&back, &err);
        if (!a || !b || !json_equal(a, b)) abort();
        json_decref(a);
        json_decref(b);
    }
    msg_free(&back);
    msg_frame_free(&f);
    free(frame);
}

static int drain(msg_decoder *d) {
    msg_frame f;
    errbuf err;
    int r;
    while ((r = msg_decoder_next(d, &f, &err)) == 1) {
        if (f.body[f.len] != '\0') abort();
        msg m;
        if (msg_decode(&f, &m, &err) == 0) {
            round_trip(&m);
            msg_free(&m);
        }
        msg_frame_free(&f);
    }
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    size_t split = data[0] % size;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    if (split > n) split = n;
    msg_decoder d;
    errbuf err;
    msg_decoder_init(&d);
    if (msg_decoder_feed(&d, rest, split, &err) == 0 && drain(&d) == 0 &&
        msg_decoder_feed(&d, rest + split, n - split, &err) == 0)
        drain(&d);
    msg_decoder_free(&d);
    return 0;
}
