#!/usr/bin/env bash
# PEFT adapters out and merged in (F27), end to end against golden/tiny-mha (PEFT 0.21):
# `fsdpctl merge` of the golden base and adapter gives lora_expected's merged.* within 1e-6
# (f32) and leaves every other tensor equal to the base, and of the rsLoRA adapter (use_rslora)
# rslora_expected's merged.*; an adapter job's checkpoint (the
# golden adapter as its masters, written by the unit test's helper) consolidates into a PEFT
# adapter directory that the Python safetensors package reads with PEFT's names, shapes and
# dtype, and into the same merged model with --merge; what is not built is refused.
source "$(dirname "$0")/lib.sh"
golden=$fixtures/golden/tiny-mha
expected=$golden/lora_expected.safetensors
helper=$build/tests/test_consolidate

# --- fsdpctl merge: f32, against PEFT's merge_and_unload ------------------------------------
"$fsdpctl" merge "$golden" "$golden/lora" "$tmp/merged" --dtype f32 > "$tmp/merge.txt" ||
    { cat "$tmp/merge.txt"; fail "merge failed"; }
grep -q "21 tensors in 1 file" "$tmp/merge.txt" || { cat "$tmp/merge.txt"; fail "merge: summary"; }
for f in model.safetensors config.json generation_config.json; do
    [ -f "$tmp/merged/$f" ] || fail "merged: no $f"
done
grep -q '"dtype": "float32"' "$tmp/merged/config.json" || fail "merged: config.json dtype"
"$fsdpctl" compare "$tmp/merged" "$expected" --prefix merged. --rtol 1e-6 > "$tmp/cmp.txt" ||
    { cat "$tmp/cmp.txt"; fail "merged: not PEFT's merged weights within 1e-6"; }
grep -q "^21 tensors compared" "$tmp/cmp.txt" || { cat "$tmp/cmp.txt"; fail "merged: not every tensor compared"; }

# Against the base: the 14 adapted weights differ, the 7 others are equal.
"$fsdpctl" compare "$tmp/merged" "$golden/model.safetensors" --rtol 0 > "$tmp/base.txt" || true
adapted=$(grep -E '_proj\.weight ' "$tmp/base.txt" | grep -vc ' 0\.000e+00' || true)
[ "$adapted" -eq 14 ] || { cat "$tmp/base.txt"; fail "$adapted adapted weights differ from the base, expected 14"; }
others=$(grep -vE '_proj\.weight |tensors compared' "$tmp/base.txt" | grep -c ' rel 0\.000e+00$' || true)
[ "$others" -eq 7 ] || { cat "$tmp/base.txt"; fail "$others other tensors equal the base, expected 7"; }

# bf16 (the default): the f32 merge rounded.
"$fsdpctl" merge "$golden" "$golden/lora" "$tmp/merged_bf16" > /dev/null
grep -q '"dtype": "bfloat16"' "$tmp/merged_bf16/config.json" || fail "bf16: config.json dtype"
"$fsdpctl" compare "$tmp/merged_bf16" "$tmp/merged" --rtol 4e-3 > "$tmp/cmp.txt" ||
    { cat "$tmp/cmp.txt"; fail "bf16: further from f32 than rounding"; }

# --- rsLoRA (use_rslora, r 16, alpha 16: scale 4): rslora_expected's merged.* --------------------
"$fsdpctl" merge "$golden" "$golden/rslora" "$tmp/rsmerged" --dtype f32 > /dev/null
"$fsdpctl" compare "$tmp/rsmerged" "$golden/rslora_expected.safetensors" --prefix merged. --rtol 1e-6 > "$tmp/cmp.txt" ||
    { cat "$tmp/cmp.txt"; fail "rsLoRA merged: not PEFT's merged weights within 1e-6"; }
grep -q "^21 tensors compared" "$tmp/cmp.txt" || { cat "$tmp/cmp.txt"; fail "rsLoRA merged: not every tensor compared"; }

# --- an adapter job's checkpoint: a PEFT adapter directory, and --merge ---------------------
"$helper" --write-adapter-checkpoint "$golden" "$golden/lora" "$tmp/ckpt" 3
"$fsdpctl" consolidate "$tmp/ckpt" "$tmp/adapter" --merge --dtype f32 > "$tmp/cons.txt" ||
    { cat "$tmp/cons.txt"; fail "consolidate --merge failed"; }
grep -q "a PEFT adapter, 28 tensors" "$tmp/cons.txt" || { cat "$tmp/cons.txt"; fail "consolidate: summary"; }
[ -f "$tmp/adapter/adapter_config.json" ] && [ ! -e "$tmp/adapter/config.json" ] ||
    fail "adapter: not a PEFT adapter directory"
cmp "$tmp/adapter/merged/model.safetensors" "$tmp/merged/model.safetensors" ||
    fail "consolidate --merge and fsdpctl merge wrote different weights"
"$fsdpctl" merge "$golden" "$tmp/adapter" "$tmp/remerged" --dtype f32 > /dev/null
cmp "$tmp/remerged/model.safetensors" "$tmp/merged/model.safetensors" ||
    fail "the adapter written merges differently from the golden one"

use_venv safetensors numpy
"$venv/bin/python" - "$tmp/adapter" "$golden/lora" "$expected" <<'PY' || fail "adapter: Python safetensors disagrees"
import json, sys
import numpy as np
from safetensors import safe_open
ours, golden, expected = sys.argv[1:]
def tensors(path):
    with safe_open(path, framework="numpy") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
meta, mine = tensors(f"{ours}/adapter_model.safetensors")
_, want = tensors(f"{golden}/adapter_model.safetensors")
assert meta == {"format": "pt"}, meta
assert sorted(mine) == sorted(want), set(mine) ^ set(want)
for k, v in want.items():
    assert mine[k].dtype == np.float32 and mine[k].shape == v.shape, (k, mine[k].dtype, mine[k].shape, v.shape)
    assert np.array_equal(mine[k], v), k
_, exp = tensors(expected)
for k in mine:
    adamw = "adamw." + k.replace(".weight", ".default.weight")
    assert np.array_equal(mine[k], exp[adamw]), k
config = json.load(open(f"{ours}/adapter_config.json"))
gold = json.load(open(f"{golden}/adapter_config.json"))
assert set(config) == set(gold), set(config) ^ set(gold)
for k in gold:
    if k in ("base_model_name_or_path", "target_modules"):
        continue
    assert config[k] == gold[k], (k, config[k], gold[k])
assert sorted(config["target_modules"]) == sorted(gold["target_modules"])
print(f"{len(mine)} adapter tensors as PEFT saves them")
PY

# --- refusals ----------------------------------------------------------------------------------
mkdir "$tmp/dora"
cp "$golden/lora/adapter_model.safetensors" "$tmp/dora/"
sed 's/"use_dora": false/"use_dora": true/' "$golden/lora/adapter_config.json" > "$tmp/dora/adapter_config.json"
expect_error 1 '"use_dora": true: DoRA is not built yet' "$fsdpctl" merge "$golden" "$tmp/dora" "$tmp/refused"
[ ! -e "$tmp/refused" ] && [ ! -e "$tmp/refused.partial" ] || fail "a refused merge left files"
expect_error 1 "merging into a quantized base is not built yet" \
    "$fsdpctl" merge "$golden/bnb4" "$golden/lora" "$tmp/refused"
make_small_model "$tmp/small"
"$helper" --write-checkpoint "$tmp/small/model.json" "$tmp/full" 2 dense
expect_error 1 "there is no adapter to merge" "$fsdpctl" consolidate "$tmp/full" "$tmp/refused" --merge
# Non-finite weights (F37): an adapter or a base with a NaN or an Inf is refused naming the
# tensor, and nothing is written.
mkdir "$tmp/nan_adapter" "$tmp/inf_base"
cp "$golden/lora/adapter_config.json" "$tmp/nan_adapter/"
cp "$golden/config.json" "$golden/generation_config.json" "$tmp/inf_base/"
"$venv/bin/python" - "$golden" "$tmp/nan_adapter" "$tmp/inf_base" <<'PY' || fail "poisoned copies not made"
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
golden, adapter, base = sys.argv[1:]
a = load_file(f"{golden}/lora/adapter_model.safetensors")
k = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"
a[k] = a[k].copy(); a[k].flat[3] = np.nan
save_file(a, f"{adapter}/adapter_model.safetensors", metadata={"format": "pt"})
b = load_file(f"{golden}/model.safetensors")
k = "model.layers.0.self_attn.v_proj.weight"
b[k] = b[k].copy(); b[k].flat[5] = -np.inf
save_file(b, f"{base}/model.safetensors", metadata={"format": "pt"})
PY
expect_error 1 "tensor base_model.model.model.layers.1.mlp.down_proj.lora_B.weight: element 3 is nan: a non-finite adapter is refused" \
    "$fsdpctl" merge "$golden" "$tmp/nan_adapter" "$tmp/refused"
[ ! -e "$tmp/refused" ] && [ ! -e "$tmp/refused.partial" ] || fail "a refused merge (NaN adapter) left files"
expect_error 1 "tensor model.layers.0.self_attn.v_proj.weight: element 5 is -inf: a non-finite base is refused" \
    "$fsdpctl" merge "$tmp/inf_base" "$golden/lora" "$tmp/refused"
[ ! -e "$tmp/refused" ] && [ ! -e "$tmp/refused.partial" ] || fail "a refused merge (Inf base) left files"
expect_error 2 "usage" "$fsdpctl" merge "$golden" "$golden/lora"
expect_error 2 "--dtype" "$fsdpctl" merge "$golden" "$golden/lora" "$tmp/refused" --dtype f16
echo "test_merge: ok"
