/* libFuzzer target for the encoder: arbitrary bytes through the two real tokenizers of
 * tests/fixtures/tokenizers (llama3's as make unpacks it into ${FSDP_BUILD:-build}/fixtures/)
 * and two small ones of fuzz_tokenizer_json's corpus with the F43 parts (NFC + Metaspace
 * "first"; NFC + byte-level with Mistral's tekken pattern) (loaded once), in every
 * special-token mode.  Text that is not UTF-8 must be refused with a message; any other must
 * encode, and decode back: exactly for byte-level Llama 3, and for the SentencePiece one when
 * special tokens are plain text and the text holds no U+2581 (which decodes to a space); NFC
 * changes text, so the small ones only decode. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"

#define NTK 4
static tokenizer *tks[NTK];
static tk_state *states[NTK];

static void load_once(void) {
    if (tks[0]) return;
    const char *build = getenv("FSDP_BUILD");
    static const char *const files[NTK] = {
        "%s/fixtures/tokenizers/llama3-tokenizer.json", "tests/fixtures/tokenizers/sp32k-tokenizer.json",
        "tests/fuzz/corpus/fuzz_tokenizer_json/nfc_metaspace.json",
        "tests/fuzz/corpus/fuzz_tokenizer_json/nfc_tekken_split.json"};
    for (int i = 0; i < NTK; i++) {
        char path[4096];
        snprintf(path, sizeof path, files[i], build && *build ? build : "build");
        errbuf err = {{0}};
        if (!(tks[i] = tokenizer_load(path, &err)) || !(states[i] = tk_state_new(tks[i]))) {
            fprintf(stderr, "fuzz_tokenize: %s (run from the repository root, after make)\n", err.msg);
            abort();
        }
    }
}

static int round_trips(int family, int flags, const uint8_t *data, size_t size) {
    if (family == 0) return 1; /* byte-level, and Llama 3 adds no BOS */
    if (family > 1) return 0;  /* NFC */
    return (flags & TK_SPLIT_SPECIAL) && !(flags & TK_ADD_SPECIAL) &&
           !memmem(data, size, "\xe2\x96\x81", 3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    for (int f = 0; f < NTK; f++)
        for (int flags = 0; flags < 4; flags++) {
            tk_ids ids = {0};
            errbuf err = {{0}};
            if (tokenizer_encode(tks[f], states[f], (const char *)data, size, flags, &ids, &err)) {
                if (!strstr(err.msg, "not valid UTF-8")) abort(); /* the only refusal */
                tk_ids_free(&ids);
                continue;
            }
            size_t n;
            char *back = tokenizer_decode(tks[f], ids.v, ids.n, &n, &err);
            if (!back) abort();
            if (round_trips(f, flags, data, size) && (n != size || memcmp(back, data, size)))
                abort();
            free(back);
            tk_ids_free(&ids);
        }
    return 0;
}
