#!/usr/bin/env bash
# The F27/F28 checks on one GPU (the LoRA and QLoRA goldens on CUDA, PEFT loading our adapters),
# each bounded by a timeout; every log lands in $OUT.  From the repository root:
#
#   tests/gpu/run_lora.sh BUILD CARRY
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; CARRY holds bnb/site
# (bitsandbytes, for PEFT's QLoRA: see bench/qlora.sh); the goldens are the working tree's
# tests/fixtures/golden/tiny-mha.  Needs torch, transformers, peft and safetensors (the device has them).
# 1. `fsdpctl reference --backend cuda --adapter` against lora_expected (--quant nf4: against
#    qlora_expected), rtol 2e-2;
# 2. fsdpd trains LoRA and QLoRA adapters on CUDA (the tiny golden model, dropout 0.1) and
#    writes a PEFT directory (LoRA: and the merged model); PEFT loads it (QLoRA: over a
#    bitsandbytes NF4 base) and its logits must equal `fsdpctl reference --adapter` (CPU, fp32;
#    QLoRA with --quant nf4) to 1e-4; transformers loads the merged model (bf16) within 2e-2.
set -u
build=${1:-build} carry=${2:-dev-carry}
out=${OUT:-/tmp/fsdp-gpu-out} backend=cuda
work=$(mktemp -d /tmp/fsdp-lora.XXXXXX)
mkdir -p "$out"
fsdpd="$build/fsdpd" fsdpctl="$build/fsdpctl" g=tests/fixtures/golden/tiny-mha
export PYTHONPATH="$PWD/$carry/bnb/site${PYTHONPATH:+:$PYTHONPATH}"
. tests/gpu/lib.sh

section "the goldens' init.* adapters as PEFT directories"
check "init adapters" python3 - "$g" "$work" <<'PY'
import os, shutil, sys
from safetensors.torch import load_file, save_file
g, work = sys.argv[1:]
for name in ["lora", "qlora"]:
    t = load_file(f"{g}/{name}_expected.safetensors"); d = f"{work}/{name}-init"; os.makedirs(d)
    save_file({k[5:].replace(".default.weight", ".weight"): v.contiguous() for k, v in t.items()
               if k.startswith("init.")}, f"{d}/adapter_model.safetensors", metadata={"format": "pt"})
    shutil.copy(f"{g}/lora/adapter_config.json", d)
PY

section "F27/F28: fsdpctl reference --backend cuda against PEFT's goldens (rtol 2e-2)"
for kind in lora qlora; do
    # the LoRA golden has one AdamW step, the QLoRA golden the base quantized
    extra=(--adamw 1e-3,0.9,0.95,1e-8,0); [ $kind = qlora ] && extra=(--quant nf4)
    check "$kind golden: reference" timeout 120 "$fsdpctl" reference --backend cuda "$g" "$g/batch.safetensors" \
        --adapter "$work/$kind-init" "${extra[@]}" --out "$work/$kind.st" > "$out/${kind}_ref.log" 2>&1 &&
        check "$kind golden: compare" "$fsdpctl" compare "$work/$kind.st" "$g/${kind}_expected.safetensors" --rtol 2e-2 \
            --subset --peft-default > "$out/${kind}_compare.txt" 2>&1
    echo "$kind: $(tail -1 "$out/${kind}_compare.txt")"
done

section "F27/F28: fsdpd on CUDA writes adapters PEFT loads"
check "synth" "$fsdpctl" synth --out "$work/d.tokens" --records 256 --seq-len 32 --vocab 211 --alphabet 16 > /dev/null
for kind in lora qlora; do
    merge=false; [ $kind = lora ] && merge=true
    check "fsdpd $kind" timeout 200 "$fsdpd" --job configs/jobs/tiny-chat.json --model.init= --model.config= \
        --model.path="$g" --data.path="$work/d.tokens" --data.format=tokens --data.template= --data.seq_len=32 --train.type=$kind \
        --lora.rank=8 --lora.alpha=16 --lora.dropout=0.1 --train.global_batch=8 --train.micro_batch=8 \
        --train.max_steps=20 --train.lr=3e-3 --train.min_lr=0 --runtime.backend=cuda --runtime.workers_per_node=1 \
        --checkpoint.dir="$work/$kind.ckpt" --checkpoint.resume=never --output.dir="$work/$kind.out" \
        --output.merge=$merge --runtime.metrics="$work/$kind.jsonl" > "$out/fsdpd_$kind.log" 2>&1 || continue
    extra=(); [ $kind = qlora ] && extra=(--quant nf4)
    check "$kind: reference on the adapter" "$fsdpctl" reference "$g" "$g/batch.safetensors" --adapter "$work/$kind.out" \
        "${extra[@]}" --out "$work/${kind}_ours.st" > /dev/null || continue
    check "$kind: PEFT loads it" python3 - "$g" "$work/$kind.out" "$work/${kind}_ours.st" $kind <<'PY'
import sys, torch
from transformers import LlamaForCausalLM, BitsAndBytesConfig
from peft import PeftModel
from safetensors.torch import load_file
g, ad, ours, kind = sys.argv[1:]
if kind == "lora":
    base = LlamaForCausalLM.from_pretrained(g, torch_dtype=torch.float32)
else:  # the base as bitsandbytes quantizes it (NF4, double quantization), fp32 compute
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.float32)
    base = LlamaForCausalLM.from_pretrained(g, quantization_config=q, device_map="cuda", torch_dtype=torch.float32)
model = PeftModel.from_pretrained(base, ad).eval()
ids = load_file(f"{g}/batch.safetensors")["input_ids"].long().to(next(model.parameters()).device)
with torch.no_grad():
    logits = model(input_ids=ids).logits.float().cpu()
ref = load_file(ours)["logits"]
rel = ((logits - ref).norm() / ref.norm()).item()
print(f"PEFT loads our {kind} adapter: logits against fsdpctl reference: rel {rel:.3e} (limit 1e-4)")
ok = rel <= 1e-4
if kind == "lora":
    merged = LlamaForCausalLM.from_pretrained(f"{ad}/merged", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        m = merged(input_ids=ids.cpu()).logits
    mrel = ((m - logits).norm() / logits.norm()).item()
    print(f"transformers loads our merged model (bf16): logits against PEFT's: rel {mrel:.3e} (limit 2e-2)")
    ok = ok and mrel <= 2e-2
sys.exit(0 if ok else 1)
PY
done
finish
