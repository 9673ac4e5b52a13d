/* Fuzzes the safetensors reader: st_parse must reject or accept any input without
 * crashing, and every tensor view it accepts must lie inside the input. */
#include <stddef.h>
#include <stdint.h>

#include "proto/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file f;
    errbuf err;
    if (st_parse(&f, data, size, "fuzz.safetensors", &err) < 0) return 0;
    /* touch every byte of every view; ASan flags any that point outside the input */
    volatile uint64_t sum = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const uint8_t *p = f.tensors[i].data;
        for (uint64_t j = 0; j < f.tensors[i].nbytes; j++) sum += p[j];
        if (st_find(&f, f.tensors[i].name) == NULL) __builtin_trap();
    }
    for (int i = 0; i < f.n_meta; i++)
        if (st_meta_get(&f, f.meta[i].key) == NULL) __builtin_trap();
    (void)sum;
    st_close(&f);
    return 0;
}
