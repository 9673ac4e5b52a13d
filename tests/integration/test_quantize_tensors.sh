#!/usr/bin/env bash
# fsdpctl quantize --tensors (F28, QLoRA) against bitsandbytes 0.50's golden outputs for
# nf4_extra's inputs (golden/README.md, "LoRA, QLoRA and NF4": 1024x1000 with 63 nested
# blocks, 333x77, an fp32 input, outliers): the same packed bytes and absmax (codes), offset
# and nested absmax within 4 fp32 ulp, dequantized values within one ulp of the input dtype.
# nf4_extra is a large fixture (tests/fixtures/README.md), read from $FSDP_SHARED: skipped,
# and counted, without it (a failure under CI=true).  test_quantize.sh has the rest.
source "$(dirname "$0")/lib.sh"

large_fixture extra golden/nf4_extra.safetensors
use_venv safetensors numpy
py() { "$venv/bin/python" - "$@"; }

# The golden inputs are stored as F32; all but rand.f32 were bf16 tensors: written back as BF16.
py "$extra" "$tmp/in.safetensors" <<'PY'
import json, struct, sys
import numpy as np
from safetensors.numpy import load_file
d = load_file(sys.argv[1])
header, blobs, at = {}, [], 0
for k in sorted(d):
    if not k.endswith(".w"):
        continue
    w = d[k].astype(np.float32)
    if "rand.f32" in k:
        dtype, b = "F32", w.tobytes()
    else:
        assert ((w.view(np.uint32) & 0xffff) == 0).all(), k
        dtype, b = "BF16", (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    header[k[:-2]] = {"dtype": dtype, "shape": list(w.shape), "data_offsets": [at, at + len(b)]}
    blobs.append(b)
    at += len(b)
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY

"$fsdpctl" quantize --tensors "$tmp/in.safetensors" "$tmp/single.safetensors" > "$tmp/q1.out" ||
    { cat "$tmp/q1.out"; fail "quantize --tensors"; }
grep -q "4 tensors quantized to NF4" "$tmp/q1.out" || fail "quantize --tensors: $(cat "$tmp/q1.out")"
"$fsdpctl" quantize --tensors "$tmp/in.safetensors" "$tmp/double.safetensors" --double-quant > /dev/null ||
    fail "quantize --tensors --double-quant"

py "$extra" "$tmp/single.safetensors" "$tmp/double.safetensors" <<'PY' || fail "--tensors differs from bitsandbytes"
import sys
import numpy as np
from safetensors.numpy import load_file
g, s, d = (load_file(p) for p in sys.argv[1:4])

def ordered(x, bf16):
    u = x.astype(np.float32).view(np.uint32).astype(np.int64)
    if bf16:
        u >>= 16
        return np.where(u & 0x8000, -(u & 0x7fff), u)
    return np.where(u & 0x80000000, -(u & 0x7fffffff), u)

def within(name, got, want, ulps, bf16=False):
    assert got.shape == want.shape, (name, got.shape, want.shape)
    diff = np.abs(ordered(got, bf16) - ordered(want, bf16)).max(initial=0)
    assert diff <= ulps, f"{name}: {diff} ulp from bitsandbytes (at most {ulps})"

def same(name, got, want):
    assert got.dtype == want.dtype and np.array_equal(got, want), f"{name}: differs from bitsandbytes"

names = sorted(k[:-2] for k in g if k.endswith(".w"))
assert len(names) == 4, names
for n in names:
    bf16 = "rand.f32" not in n
    same(n + ".packed", s[n + ".packed"], g[n + ".packed"])
    same(n + ".absmax", s[n + ".absmax"], g[n + ".absmax"])
    within(n + ".dq", s[n + ".dq"], g[n + ".dq"], 1, bf16)
    for f in ("packed", "absmax_q", "nested_code"):
        same(f"{n}.dq2.{f}", d[f"{n}.dq2.{f}"], g[f"{n}.dq2.{f}"])
    for f in ("offset", "nested_absmax"):
        within(f"{n}.dq2.{f}", d[f"{n}.dq2.{f}"], g[f"{n}.dq2.{f}"], 4)
    within(n + ".dq2.dq", d[n + ".dq2.dq"], g[n + ".dq2.dq"], 1, bf16)
    assert len(s) == 3 * len(names) and len(d) == 6 * len(names), (len(s), len(d))
PY

echo "test_quantize_tensors: ok"
