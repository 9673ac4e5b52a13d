#!/usr/bin/env bash
# fsdpctl reference --adapter against PEFT's golden outputs (F27, F28): from the golden's init.*
# adapters written as a PEFT adapter directory, the logits, the loss, every adapter gradient
# and one AdamW step (lora_expected.safetensors, 1e-5), and with --quant nf4 the same over
# the base quantized by bitsandbytes (qlora_expected.safetensors: logits, loss, gradients,
# 1e-4); rsLoRA (use_rslora, r 16, alpha 16: rslora_expected.safetensors, 1e-5), and the same
# adapter read without use_rslora is off it.  Then --adapter's refusals.
source "$(dirname "$0")/lib.sh"
golden=$fixtures/golden/tiny-mha
use_venv safetensors numpy

# init_dir GOLDEN_FILE DIR [ADAPTER]: its init.* as a PEFT adapter directory (PEFT's saved
# names: no "init." and no ".default"), with the config of the golden adapter directory
# ADAPTER (default lora: r 8, alpha 16, every linear).
init_dir() {
    mkdir -p "$2"
    cp "$golden/${3:-lora}/adapter_config.json" "$2/"
    "$venv/bin/python" - "$1" "$2/adapter_model.safetensors" <<'PY'
import sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1])
save_file({k[len("init."):].replace(".default.weight", ".weight"): v for k, v in t.items()
           if k.startswith("init.")}, sys.argv[2], metadata={"format": "pt"})
PY
}
init_dir "$golden/lora_expected.safetensors" "$tmp/lora-init"
init_dir "$golden/qlora_expected.safetensors" "$tmp/qlora-init"
init_dir "$golden/rslora_expected.safetensors" "$tmp/rslora-init" rslora

# --- LoRA ------------------------------------------------------------------------------------
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/lora-init" \
    --adamw 1e-3,0.9,0.95,1e-8,0 --out "$tmp/lora.safetensors" > /dev/null
"$fsdpctl" compare "$tmp/lora.safetensors" "$golden/lora_expected.safetensors" --rtol 1e-5 --subset \
    --peft-default > "$tmp/lora.txt" || { cat "$tmp/lora.txt" >&2; fail "LoRA reference does not match PEFT"; }
tail -1 "$tmp/lora.txt"
# logits, loss, 28 adapter gradients, 28 AdamW steps: nothing of the frozen base
grep -q '^58 tensors compared, .*: 0 problems$' "$tmp/lora.txt" || fail "not every tensor was compared"
grep -q '^grad.model' "$tmp/lora.txt" && fail "the frozen base has gradients"

# an adapter's lora_dropout does not make the reference random: dropout is off
mkdir -p "$tmp/lora-drop" && cp "$tmp/lora-init/adapter_model.safetensors" "$tmp/lora-drop/"
sed 's/"lora_dropout": 0.0/"lora_dropout": 0.1/' "$golden/lora/adapter_config.json" > "$tmp/lora-drop/adapter_config.json"
grep -q '"lora_dropout": 0.1' "$tmp/lora-drop/adapter_config.json" || fail "no dropout set"
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/lora-drop" \
    --adamw 1e-3,0.9,0.95,1e-8,0 --out "$tmp/drop.safetensors" > /dev/null
"$fsdpctl" compare "$tmp/drop.safetensors" "$tmp/lora.safetensors" --rtol 0 > "$tmp/cmp.txt" ||
    { cat "$tmp/cmp.txt"; fail "the adapter's dropout changed the reference"; }

# --- rsLoRA: scale alpha / sqrt(r) = 4 where alpha / r would be 1 -------------------------------
grep -q '"use_rslora": true' "$tmp/rslora-init/adapter_config.json" && grep -q '"r": 16,' "$tmp/rslora-init/adapter_config.json" ||
    fail "the rsLoRA golden's config is not use_rslora, r 16"
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/rslora-init" \
    --adamw 1e-3,0.9,0.95,1e-8,0 --out "$tmp/rslora.safetensors" > /dev/null
"$fsdpctl" compare "$tmp/rslora.safetensors" "$golden/rslora_expected.safetensors" --rtol 1e-5 --subset \
    --peft-default > "$tmp/rslora.txt" || { cat "$tmp/rslora.txt" >&2; fail "rsLoRA reference does not match PEFT"; }
tail -1 "$tmp/rslora.txt"
grep -q '^58 tensors compared, .*: 0 problems$' "$tmp/rslora.txt" || fail "rsLoRA: not every tensor was compared"
# the same adapter as plain LoRA (scale 1) is off the golden: the check can fail
mkdir -p "$tmp/rslora-off" && cp "$tmp/rslora-init/adapter_model.safetensors" "$tmp/rslora-off/"
sed 's/"use_rslora": true/"use_rslora": false/' "$tmp/rslora-init/adapter_config.json" > "$tmp/rslora-off/adapter_config.json"
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/rslora-off" \
    --adamw 1e-3,0.9,0.95,1e-8,0 --out "$tmp/rslora-off.safetensors" > /dev/null
expect_status 1 "> rtol" "$fsdpctl" compare "$tmp/rslora-off.safetensors" "$golden/rslora_expected.safetensors" \
    --rtol 1e-5 --subset --peft-default

# --- QLoRA -----------------------------------------------------------------------------------
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/qlora-init" --quant nf4 \
    --out "$tmp/qlora.safetensors" > /dev/null
"$fsdpctl" compare "$tmp/qlora.safetensors" "$golden/qlora_expected.safetensors" --rtol 1e-4 --subset \
    --peft-default > "$tmp/qlora.txt" || { cat "$tmp/qlora.txt" >&2; fail "QLoRA reference does not match PEFT + bitsandbytes"; }
tail -1 "$tmp/qlora.txt"
grep -q '^30 tensors compared, .*: 0 problems$' "$tmp/qlora.txt" || fail "not every tensor was compared"
# without the quantization the QLoRA golden is not met: the check can fail
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/qlora-init" \
    --out "$tmp/plain.safetensors" > /dev/null
expect_status 1 "> rtol" "$fsdpctl" compare "$tmp/plain.safetensors" "$golden/qlora_expected.safetensors" \
    --rtol 1e-4 --subset --peft-default

# --- the other families ------------------------------------------------------------------------
for family in tiny-qwen2 tiny-qwen3 tiny-mistral-sw; do
    dir=$fixtures/golden/$family
    "$venv/bin/python" tests/integration/lora_family_ref.py make "$dir" "$tmp/$family-lora" "$tmp/$family-merged"
    cp "$golden/lora/adapter_config.json" "$tmp/$family-lora/"
    "$fsdpctl" reference "$tmp/$family-merged" "$dir/batch.safetensors" --out "$tmp/$family-merged.safetensors" > /dev/null
    "$venv/bin/python" tests/integration/lora_family_ref.py expect "$tmp/$family-lora" \
        "$tmp/$family-merged.safetensors" "$tmp/$family-expected.safetensors"
    "$fsdpctl" reference "$dir" "$dir/batch.safetensors" --adapter "$tmp/$family-lora" \
        --out "$tmp/$family-out.safetensors" > /dev/null
    "$fsdpctl" compare "$tmp/$family-out.safetensors" "$tmp/$family-expected.safetensors" --rtol 1e-4 \
        --peft-default > "$tmp/$family.txt" || { cat "$tmp/$family.txt" >&2; fail "$family: LoRA is not the merged model"; }
    echo "$family LoRA: $(tail -1 "$tmp/$family.txt")"
    # logits, loss and 2 layers x 7 modules x (A, B): nothing of the base, the biases neither
    grep -q '^30 tensors compared, .*: 0 problems$' "$tmp/$family.txt" || fail "$family: not every tensor was compared"
done
# the check can fail: the adapter of another family's model is not its merge
expect_status 1 "> rtol" "$fsdpctl" compare "$tmp/tiny-qwen2-out.safetensors" "$tmp/tiny-mistral-sw-expected.safetensors" \
    --rtol 1e-4 --peft-default

# --- refusals --------------------------------------------------------------------------------
expect_status 1 "$tmp/none" "$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/none" --out "$tmp/x"
expect_status 2 "--quant is nf4" "$fsdpctl" reference "$golden" "$golden/batch.safetensors" --quant fp4 --out "$tmp/x"
mkdir -p "$tmp/dora" && cp "$tmp/lora-init/adapter_model.safetensors" "$tmp/dora/"
sed 's/"use_dora": false/"use_dora": true/' "$golden/lora/adapter_config.json" > "$tmp/dora/adapter_config.json"
expect_status 1 "not built yet" "$fsdpctl" reference "$golden" "$golden/batch.safetensors" --adapter "$tmp/dora" --out "$tmp/x"
[ ! -e "$tmp/x" ] || fail "a failed reference left $tmp/x behind"
echo "reference lora: ok"
