/* Fuzzes the proto/ctl decoder: the first byte picks where the rest of the input is split
 * into two feeds, as a socket would deliver it; every message is taken out and its body
 * parsed as JSON. */
#include <stdint.h>
#include <stdlib.h>

#include "proto/ctl.h"

static int drain(ctl_decoder *d) {
    ctl_msg m;
    errbuf err;
    int r;
    while ((r = ctl_decoder_next(d, &m, &err)) == 1) {
        json_t *j;
        if (ctl_msg_json(&m, &j, &err) == 0) json_decref(j);
        if (m.body[m.len] != '\0') abort();
        ctl_msg_free(&m);
    }
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    size_t split = data[0] % size;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    if (split > n) split = n;
    ctl_decoder d;
    errbuf err;
    ctl_decoder_init(&d);
    if (ctl_decoder_feed(&d, rest, split, &err) == 0 && drain(&d) == 0 &&
        ctl_decoder_feed(&d, rest + split, n - split, &err) == 0)
        drain(&d);
    ctl_decoder_free(&d);
    return 0;
}
