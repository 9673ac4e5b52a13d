/* libFuzzer target for the tokenizer.json loader: any input is refused with a message or
 * gives a tokenizer that encodes a fixed text (and the input's first bytes, when they are
 * UTF-8) and decodes the ids it gives, without crashing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"

static void exercise(const tokenizer *tk, tk_state *st, const char *text, size_t len) {
    for (int flags = 0; flags < 4; flags++) {
        tk_ids ids = {0};
        errbuf err = {{0}};
        if (tokenizer_encode(tk, st, text, len, flags, &ids, &err) == 0) {
            size_t n;
            char *back = tokenizer_decode(tk, ids.v, ids.n, &n, &err);
            if (!back && !err.msg[0]) abort();
            free(back);
        } else if (!err.msg[0]) abort();
        tk_ids_free(&ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    errbuf err = {{0}};
    tokenizer *tk = tokenizer_parse((const char *)data, size, NULL, 0, "fuzz.json", &err);
    if (!tk) {
        if (!err.msg[0]) abort(); /* a failure always says why */
        return 0;
    }
    tk_state *st = tk_state_new(tk);
    if (st) {
        static const char text[] = "Hello <s> w\xc3\xb6rld  \t\n\xf0\x9f\x98\x80 ab_c 123</s>";
        exercise(tk, st, text, sizeof text - 1);
        exercise(tk, st, (const char *)data, size < 64 ? size : 64);
        tk_state_free(st);
    }
    tokenizer_free(tk);
    return 0;
}
