/* nf4_tables: the two code tables of bitsandbytes' NF4 (QLoRA, DESIGN.md "LoRA and QLoRA"),
 * written once as initializers so that proto/nf4.c (quantization, the bnb-4bit layout), the
 * CPU kernel and the CUDA kernel (as __constant__ arrays) use the same values:
 *
 *   static const float t[16] = NF4_CODE_VALUES;
 *
 * NF4_CODE_VALUES: bnb's nf4_dequantization_lut (csrc/kernels.cu, its quant_map), the fp32
 * values of its literals: code c dequantizes to NF4_CODE_VALUES[c] * absmax.
 * NF4_DYNAMIC_MAP_VALUES: create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)
 * as torch computes it in fp32 (bitsandbytes/functional.py, the nested_quant_map), exact: the
 * 8-bit codes of double quantization's absmax values. */
#ifndef FSDP_NF4_TABLES_H
#define FSDP_NF4_TABLES_H

#define NF4_BLOCK 64         /* values that share an absmax */
#define NF4_NESTED_BLOCK 256 /* absmax values that share a nested absmax (double quantization) */

#define NF4_CODE_VALUES \
    { \
        -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, \
        -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f, \
        0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f, \
        0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f, \
    }

#define NF4_DYNAMIC_MAP_VALUES \
    { \
        -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.ee0000p-1f, -0x1.e6ccccp-1f, \
        -0x1.df999ap-1f, -0x1.d86666p-1f, -0x1.d13334p-1f, -0x1.ca0000p-1f, \
        -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f, \
        -0x1.a60000p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f, \
        -0x1.893334p-1f, -0x1.820000p-1f, -0x1.7accccp-1f, -0x1.73999ap-1f, \
        -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5e0000p-1f, -0x1.56ccccp-1f, \
        -0x1.4f999ap-1f, -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3a0000p-1f, \
        -0x1.32ccccp-1f, -0x1.2b999ap-1f, -0x1.246668p-1f, -0x1.1d3334p-1f, \
        -0x1.160000p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f, -0x1.006666p-1f, \
        -0x1.f26664p-2f, -0x1.e40000p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f, \
        -0x1.b8ccccp-2f, -0x1.aa6666p-2f, -0x1.9c0000p-2f, -0x1.8d9998p-2f, \
        -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.540000p-2f, \
        -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f, \
        -0x1.0c0000p-2f, -0x1.fb3332p-3f, -0x1.de6666p-3f, -0x1.c1999ap-3f, \
        -0x1.a4ccccp-3f, -0x1.880000p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f, \
        -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.f00000p-4f, -0x1.b66668p-4f, \
        -0x1.93d70ap-4f, -0x1.8851eep-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f, \
        -0x1.65c290p-4f, -0x1.5a3d70p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f, \
        -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f, \
        -0x1.09999ap-4f, -0x1.fc28f6p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f, \
        -0x1.b70a3ep-5f, -0x1.a00000p-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f, \
        -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c290p-5f, \
        -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f, -0x1.a147aep-6f, -0x1.733334p-6f, \
        -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c290p-7f, \
        -0x1.3e76c8p-7f, -0x1.2c0830p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f, \
        -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f, \
        -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f, \
        -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, \
        -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d500p-11f, -0x1.3dd982p-11f, \
        -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f, \
        -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, \
        -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0x0p+0f, \
        0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f, \
        0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f, \
        0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f, \
        0x1.78d500p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f, \
        0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, \
        0x1.0c49bap-8f, 0x1.3126e8p-8f, 0x1.56041ap-8f, 0x1.7ae148p-8f, \
        0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f, \
        0x1.19999ap-7f, 0x1.2c0830p-7f, 0x1.3e76c8p-7f, 0x1.75c290p-7f, \
        0x1.d1eb86p-7f, 0x1.170a3ep-6f, 0x1.451ebap-6f, 0x1.733334p-6f, \
        0x1.a147aep-6f, 0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c290p-5f, \
        0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f, \
        0x1.88f5c2p-5f, 0x1.a00000p-5f, 0x1.b70a3ep-5f, 0x1.ce147ap-5f, \
        0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f, \
        0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f, \
        0x1.4eb854p-4f, 0x1.5a3d70p-4f, 0x1.65c290p-4f, 0x1.7147aep-4f, \
        0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f, \
        0x1.f00000p-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, \
        0x1.6b3334p-3f, 0x1.880000p-3f, 0x1.a4ccccp-3f, 0x1.c1999ap-3f, \
        0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0c0000p-2f, 0x1.1a6668p-2f, \
        0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.540000p-2f, \
        0x1.626666p-2f, 0x1.70ccccp-2f, 0x1.7f3334p-2f, 0x1.8d9998p-2f, \
        0x1.9c0000p-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f, \
        0x1.d59998p-2f, 0x1.e40000p-2f, 0x1.f26664p-2f, 0x1.006666p-1f, \
        0x1.079998p-1f, 0x1.0eccccp-1f, 0x1.160000p-1f, 0x1.1d3334p-1f, \
        0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3a0000p-1f, \
        0x1.413334p-1f, 0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f, \
        0x1.5e0000p-1f, 0x1.653334p-1f, 0x1.6c6668p-1f, 0x1.73999ap-1f, \
        0x1.7accccp-1f, 0x1.820000p-1f, 0x1.893334p-1f, 0x1.906666p-1f, \
        0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a60000p-1f, 0x1.ad3334p-1f, \
        0x1.b46666p-1f, 0x1.bb999ap-1f, 0x1.c2ccccp-1f, 0x1.ca0000p-1f, \
        0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f, \
        0x1.ee0000p-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1.000000p+0f, \
    }

#endif
