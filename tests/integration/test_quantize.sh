#!/usr/bin/env bash
# fsdpctl quantize (F28, QLoRA) against bitsandbytes 0.50's golden outputs (golden/README.md,
# "LoRA, QLoRA and NF4"):
#  --tensors on nf4_extra's inputs: the same packed bytes and absmax (codes), offset and nested
#    absmax within 4 fp32 ulp, dequantized values within one ulp of the input dtype;
#  MODEL_DIR OUT_DIR on tiny-mha: golden bnb4/ tensor by tensor (names, dtypes, shapes, bytes),
#    except what may legitimately differ: nested_absmax and the quant_state's nested_offset
#    (torch's CUDA mean, within 4 ulp), and config.json compared as JSON (jansson spells
#    rms_norm_eps 1e-5 where Python writes 1e-05; bnb4/ was made with compute dtype float32,
#    our default is bfloat16); the tokenizer files copied; the error paths.
source "$(dirname "$0")/lib.sh"

use_venv safetensors numpy
py() { "$venv/bin/python" - "$@"; }
golden=$shared/golden

# The golden inputs are stored as F32; all but rand.f32 were bf16 tensors: written back as BF16.
py "$golden/nf4_extra.safetensors" "$tmp/in.safetensors" <<'PY'
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

py "$golden/nf4_extra.safetensors" "$tmp/single.safetensors" "$tmp/double.safetensors" <<'PY' || fail "--tensors differs from bitsandbytes"
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

# A model directory with tokenizer files, quantized as transformers saves it.
mkdir "$tmp/src"
cp "$golden/tiny-mha/config.json" "$golden/tiny-mha/generation_config.json" \
    "$golden/tiny-mha/model.safetensors" "$tmp/src/"
echo '{"model": {"type": "BPE"}}' > "$tmp/src/tokenizer.json"
echo '{"bos_token": "<s>"}' > "$tmp/src/tokenizer_config.json"
"$fsdpctl" quantize "$tmp/src" "$tmp/q32" --compute-dtype f32 > "$tmp/q.out" || { cat "$tmp/q.out"; fail "quantize MODEL_DIR"; }
grep -q "14 linears in NF4" "$tmp/q.out" || fail "quantize MODEL_DIR: $(cat "$tmp/q.out")"
"$fsdpctl" quantize "$tmp/src" "$tmp/qbf16" > /dev/null || fail "quantize MODEL_DIR (bf16)"
for f in tokenizer.json tokenizer_config.json generation_config.json; do
    cmp -s "$tmp/src/$f" "$tmp/q32/$f" || fail "$f not copied"
done
[ ! -e "$tmp/q32.partial" ] || fail "q32.partial left behind"

py "$golden/tiny-mha/bnb4" "$tmp/q32" "$tmp/qbf16" <<'PY' || fail "the bnb-4bit directory differs from golden bnb4/"
import json, sys
import numpy as np
from safetensors.numpy import load_file
golden, ours, bf16 = sys.argv[1:4]
g, o = load_file(golden + "/model.safetensors"), load_file(ours + "/model.safetensors")
assert sorted(g) == sorted(o), sorted(set(g) ^ set(o))

def ulps(a, b):
    ia, ib = (np.float32(x).view(np.int32).astype(np.int64) for x in (a, b))
    return abs(int(ia) - int(ib))

for k in sorted(g):
    assert g[k].dtype == o[k].dtype and g[k].shape == o[k].shape, (k, g[k].dtype, o[k].dtype, g[k].shape, o[k].shape)
    if k.endswith(".nested_absmax"):  # from absmax - the offset: within a few ulp
        assert all(ulps(a, b) <= 4 for a, b in zip(g[k], o[k])), k
    elif k.endswith(".quant_state.bitsandbytes__nf4"):  # the same JSON bar the offset's last digits
        gs, os_ = json.loads(bytes(g[k])), json.loads(bytes(o[k]))
        assert ulps(gs.pop("nested_offset"), os_.pop("nested_offset")) <= 4, k
        assert gs == os_, (k, gs, os_)
        assert list(json.loads(bytes(g[k]))) == list(json.loads(bytes(o[k]))), k  # key order too
    else:
        assert np.array_equal(g[k], o[k]), k

gc, oc = (json.load(open(d + "/config.json")) for d in (golden, ours))
assert gc == oc, (gc, oc)
bc = json.load(open(bf16 + "/config.json"))
assert bc["quantization_config"].pop("bnb_4bit_compute_dtype") == "bfloat16"
gc["quantization_config"].pop("bnb_4bit_compute_dtype")
assert bc == gc, bc
PY

# Errors: an existing OUT_DIR, a quantized model, bad arguments, a file without floats.
expect_error 1 "exists already" "$fsdpctl" quantize "$tmp/src" "$tmp/q32"
expect_error 1 "quantized already" "$fsdpctl" quantize "$tmp/q32" "$tmp/again"
[ ! -e "$tmp/again" ] && [ ! -e "$tmp/again.partial" ] || fail "a refused run left an output"
expect_error 2 "--compute-dtype 'f8'" "$fsdpctl" quantize "$tmp/src" "$tmp/x" --compute-dtype f8
expect_error 2 "--double-quant goes with --tensors" "$fsdpctl" quantize "$tmp/src" "$tmp/x" --double-quant
expect_error 2 "usage" "$fsdpctl" quantize --tensors "$tmp/in.safetensors"
py "$tmp/ints.safetensors" <<'PY'
import sys
import numpy as np
from safetensors.numpy import save_file
save_file({"ids": np.arange(6, dtype=np.int32)}, sys.argv[1])
PY
expect_error 1 "no F32, BF16 or F16 tensor" "$fsdpctl" quantize --tensors "$tmp/ints.safetensors" "$tmp/x.safetensors"
# A config.json that disagrees with the weights' shapes (F37): refused before anything is
# written, naming the tensor, as fsdpd would refuse the directory.
mkdir "$tmp/wrong"
cp "$tmp/src/model.safetensors" "$tmp/wrong/"
sed 's/"intermediate_size": 172/"intermediate_size": 128/' "$tmp/src/config.json" > "$tmp/wrong/config.json"
grep -q '"intermediate_size": 128' "$tmp/wrong/config.json" || fail "the wrong config.json was not made"
expect_error 1 "config.json disagrees with the weights: $tmp/wrong: tensor model.layers.0.mlp.gate_proj.weight has shape [172, 64], expected [128, 64]" \
    "$fsdpctl" quantize "$tmp/wrong" "$tmp/wrong_q"
[ ! -e "$tmp/wrong_q" ] && [ ! -e "$tmp/wrong_q.partial" ] || fail "a refused quantize left an output"
sed 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$tmp/src/config.json" > "$tmp/wrong/config.json"
expect_error 1 "tensor model.layers.2.self_attn.q_proj.weight is missing" "$fsdpctl" quantize "$tmp/wrong" "$tmp/wrong_q"
echo "test_quantize: ok"
