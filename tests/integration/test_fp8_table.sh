#!/usr/bin/env bash
# base/fp8.h against ml_dtypes (a real implementation of float8_e4m3fn and float8_e5m2): every
# one of the 2^16 bf16 values encoded to both formats the way cuBLASLt's inputs are made
# (ml_dtypes' cast after a clamp to +-max: saturation, then nearest even), code for code, NaNs
# to a NaN code; and every one of the 256 codes of each format decoded to the same fp32 value.
source "$(dirname "$0")/lib.sh"
use_venv numpy ml_dtypes
cc -std=c11 -O2 -Wall -Wextra -Werror -I. tests/integration/fp8_table.c -o "$tmp/fp8_table"
"$tmp/fp8_table" encode > "$tmp/encode.bin"
"$tmp/fp8_table" decode > "$tmp/decode.bin"
"$venv/bin/python" - "$tmp/encode.bin" "$tmp/decode.bin" <<'PY' || fail "base/fp8.h differs from ml_dtypes"
import sys
import numpy as np
import ml_dtypes

ours = np.fromfile(sys.argv[1], dtype=np.uint8).reshape(65536, 2)
decoded = np.fromfile(sys.argv[2], dtype=np.float32).reshape(256, 2)
x = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
bad = 0
for col, (dtype, top) in enumerate([(ml_dtypes.float8_e4m3fn, 448.0), (ml_dtypes.float8_e5m2, 57344.0)]):
    name = np.dtype(dtype).name
    want = np.clip(x, -top, top).astype(dtype).view(np.uint8)
    nan_in = np.isnan(x)
    theirs_nan = np.isnan(want.view(dtype).astype(np.float32))
    ours_nan = np.isnan(ours[:, col].view(dtype).astype(np.float32))
    diff = np.nonzero(~nan_in & (ours[:, col] != want))[0]
    for i in diff[:10]:
        print(f"{name}: bf16 0x{i:04x} ({x[i]!r}): ours 0x{ours[i, col]:02x}, ml_dtypes 0x{want[i]:02x}")
    if not (theirs_nan[nan_in].all() and ours_nan[nan_in].all()):
        print(f"{name}: a NaN input did not give a NaN code")
        bad += 1
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    same = (codes.view(np.uint32) == decoded[:, col].view(np.uint32)) | (np.isnan(codes) & np.isnan(decoded[:, col]))
    for c in np.nonzero(~same)[0][:10]:
        print(f"{name}: code 0x{c:02x} decodes to {decoded[c, col]!r}, ml_dtypes {codes[c]!r}")
    bad += len(diff) + int((~same).sum())
    print(f"{name}: {65536 - nan_in.sum()} finite and infinite inputs, {nan_in.sum()} NaNs, 256 codes; {bad} differences so far")
sys.exit(1 if bad else 0)
PY
echo "PASS: base/fp8.h matches ml_dtypes on all 2^16 bf16 inputs and all 256 codes of e4m3 and e5m2"
