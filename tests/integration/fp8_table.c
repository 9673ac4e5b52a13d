/* fp8_table: base/fp8.h's tables for test_fp8_table.sh, on stdout (binary, little-endian).
 *   fp8_table encode: for each bf16 bit pattern 0 .. 65535 (as fp32, exact), its e4m3 code
 *                     then its e5m2 code (2 x 65536 bytes);
 *   fp8_table decode: for each code 0 .. 255, fp8_to_f32 in e4m3 then in e5m2 (fp32 pairs). */
#include <stdio.h>
#include <string.h>

#include "base/fp8.h"

int main(int argc, char **argv) {
    int encode = argc == 2 && !strcmp(argv[1], "encode");
    if (argc != 2 || (!encode && strcmp(argv[1], "decode"))) {
        fprintf(stderr, "usage: fp8_table encode|decode\n");
        return 2;
    }
    for (uint32_t i = 0; i < (encode ? 65536u : 256u); i++) {
        if (encode) {
            float x = fp8_bits_f32(i << 16);
            uint8_t codes[2] = {fp8_from_f32(x, FP8_E4M3), fp8_from_f32(x, FP8_E5M2)};
            if (fwrite(codes, 1, 2, stdout) != 2) return 1;
        } else {
            float v[2] = {fp8_to_f32((uint8_t)i, FP8_E4M3), fp8_to_f32((uint8_t)i, FP8_E5M2)};
            if (fwrite(v, sizeof v[0], 2, stdout) != 2) return 1;
        }
    }
    return fflush(stdout) ? 1 : 0;
}
