#!/usr/bin/env bash
# fsdpctl quantize (F28, QLoRA) against bitsandbytes 0.50's golden outputs (golden/README.md,
# "LoRA, QLoRA and NF4"; --tensors on nf4_extra, a large fixture, is test_quantize_tensors.sh):
#  MODEL_DIR OUT_DIR on tiny-mha: golden bnb4/ tensor by tensor (names, dtypes, shapes, bytes),
#    except what may legitimately differ: nested_absmax and the quant_state's nested_offset
#    (torch's CUDA mean, within 4 ulp), and config.json compared as JSON (jansson spells
#    rms_norm_eps 1e-5 where Python writes 1e-05; bnb4/ was made with compute dtype float32,
#    our default is bfloat16); the tokenizer files copied; the error paths.
source "$(dirname "$0")/lib.sh"

use_venv safetensors numpy
py() { "$venv/bin/python" - "$@"; }
golden=$fixtures/golden

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
