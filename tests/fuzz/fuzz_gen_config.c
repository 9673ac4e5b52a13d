/* libFuzzer target for gen_config_parse: any input is refused with a message or gives stop
 * ids in range, at most GEN_CONFIG_MAX_STOP of them. */
#include <stdint.h>
#include <stdlib.h>

#include "proto/gen_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gen_config g;
    errbuf err = {{0}};
    if (gen_config_parse(&g, (const char *)data, size, "fuzz.json", &err) < 0) {
        if (!err.msg[0] || g.n_eos != 0) abort(); /* a failure says why and leaves nothing */
        return 0;
    }
    if (g.n_eos < 0 || g.n_eos > GEN_CONFIG_MAX_STOP) abort();
    for (int i = 0; i < g.n_eos; i++)
        if (g.eos[i] < 0) abort();
    return 0;
}
