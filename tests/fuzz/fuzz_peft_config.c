/* libFuzzer target for peft_parse_config: any input must be rejected with a message or give
 * a config the adapter layout accepts, whose written text parses back to the same config. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/peft.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lora_config c, back;
    errbuf err = {{0}};
    if (peft_parse_config(&c, (const char *)data, size, "fuzz.json", &err) < 0) {
        if (!err.msg[0]) abort(); /* a failure always says why */
        return 0;
    }
    if (c.rank < 1 || c.rank > PEFT_MAX_RANK || !(c.alpha > 0) || !(c.dropout >= 0 && c.dropout < 1) ||
        (c.targets & ~LORA_ALL_LINEAR) || !c.targets)
        abort();
    char *text = peft_config_text(&c, "fuzz", &err);
    if (!text) abort();
    if (peft_parse_config(&back, text, strlen(text), "written", &err) || back.rank != c.rank ||
        back.alpha != c.alpha || back.dropout != c.dropout || back.rslora != c.rslora ||
        back.targets != c.targets)
        abort();
    free(text);
    return 0;
}
