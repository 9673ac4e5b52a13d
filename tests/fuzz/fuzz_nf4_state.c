/* libFuzzer target for nf4_state_parse (the quant_state JSON of a bnb-4bit weight): any input
 * must be rejected with a message, or give a state that formats as bitsandbytes writes it and
 * parses back to the same state and the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/nf4.h"

static int same_state(const nf4_quant_state *a, const nf4_quant_state *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->nested != b->nested) return 0;
    if (a->nested && a->nested_offset != b->nested_offset) return 0;
    return !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nf4_quant_state s, back, again;
    errbuf err = {{0}};
    if (nf4_state_parse(data, size, &s, &err) < 0) {
        if (!err.msg[0]) abort(); /* a failure always says why */
        return 0;
    }
    size_t len, len2;
    char *text = nf4_state_format(&s, &len);
    if (!text) return 0;
    if (nf4_state_parse(text, len, &back, &err) < 0 || !same_state(&s, &back)) abort();
    char *text2 = nf4_state_format(&back, &len2);
    if (text2 && (len2 != len || memcmp(text, text2, len))) abort();
    if (text2 && (nf4_state_parse(text2, len2, &again, &err) < 0 || !same_state(&back, &again))) abort();
    free(text);
    free(text2);
    return 0;
}
