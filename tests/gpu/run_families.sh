#!/usr/bin/env bash
# F43 on one GPU: fsdpctl reference --backend cuda against the transformers goldens of the other
# families (tests/fixtures/golden/tiny-qwen2: q/k/v biases, tiny-qwen3: q/k norms and head_dim 24,
# tiny-mistral-sw: sliding window 12 over 33 tokens; logits, loss, every gradient and one AdamW
# step, DESIGN.md's CUDA tolerance 2e-2), the same with a LoRA adapter on every linear (the
# merged model's figures, tests/integration/lora_family_ref.py), and QLoRA's reference run of
# each; then a short fsdpd CUDA training run of each family (full and QLoRA, the
# test_families.sh models) whose losses must be finite and fall.  From the repository root:
#
#   tests/gpu/run_families.sh BUILD GOLDEN
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; GOLDEN is tests/fixtures/golden (or a
# copy carried to the device).  Needs python3 with numpy and safetensors.  Logs in $OUT; the
# last lines list the failures, and the exit status is 1 when there was one.
set -u
build=${1:-build} golden=${2:-tests/fixtures/golden}
out=${OUT:-/tmp/fsdp-gpu-out}
backend=${BACKEND:-cuda}
work=$(mktemp -d /tmp/fsdp-families.XXXXXX)
mkdir -p "$out"
fsdpd="$build/fsdpd" fsdpctl="$build/fsdpctl"
. tests/gpu/lib.sh

section "device"
[ "$backend" != cuda ] || check "nvidia-smi" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

for family in tiny-qwen2 tiny-qwen3 tiny-mistral-sw; do
    g=$golden/$family
    section "$family: fsdpctl reference --backend $backend vs transformers (rtol 2e-2)"
    check "$family: reference" timeout 120 "$fsdpctl" reference --backend "$backend" "$g" "$g/batch.safetensors" \
        --out "$work/$family.safetensors" --adamw 1e-3,0.9,0.95,1e-8,0.1 > "$out/$family.log" 2>&1 &&
        check "$family: compare" timeout 60 "$fsdpctl" compare "$work/$family.safetensors" "$g/expected.safetensors" \
            --rtol 2e-2 > "$out/${family}_compare.txt" 2>&1
    echo "$family: $(tail -1 "$out/${family}_compare.txt" 2>/dev/null)"

    section "$family: LoRA on every linear ($backend) vs the merged model (rtol 2e-2)"
    python3 tests/integration/lora_family_ref.py make "$g" "$work/$family-lora" "$work/$family-merged" &&
        cp "$golden/tiny-mha/lora/adapter_config.json" "$work/$family-lora/" &&
        timeout 120 "$fsdpctl" reference --backend cpu "$work/$family-merged" "$g/batch.safetensors" \
            --out "$work/$family-merged.safetensors" > /dev/null &&
        python3 tests/integration/lora_family_ref.py expect "$work/$family-lora" "$work/$family-merged.safetensors" \
            "$work/$family-lora-expected.safetensors" || failed "$family: making the LoRA reference"
    check "$family: LoRA reference" timeout 120 "$fsdpctl" reference --backend "$backend" "$g" "$g/batch.safetensors" \
        --adapter "$work/$family-lora" --out "$work/$family-lora.safetensors" > "$out/${family}_lora.log" 2>&1 &&
        check "$family: LoRA compare" timeout 60 "$fsdpctl" compare "$work/$family-lora.safetensors" \
            "$work/$family-lora-expected.safetensors" --rtol 2e-2 --peft-default > "$out/${family}_lora_compare.txt" 2>&1
    echo "$family LoRA: $(tail -1 "$out/${family}_lora_compare.txt" 2>/dev/null)"
    # QLoRA: the CUDA reference over the NF4 base against the CPU one (same quantization)
    check "$family: QLoRA reference (cpu)" timeout 120 "$fsdpctl" reference --backend cpu "$g" "$g/batch.safetensors" \
        --adapter "$work/$family-lora" --quant nf4 --out "$work/$family-qlora-cpu.safetensors" > /dev/null 2>&1 &&
        check "$family: QLoRA reference ($backend)" timeout 120 "$fsdpctl" reference --backend "$backend" "$g" \
            "$g/batch.safetensors" --adapter "$work/$family-lora" --quant nf4 --out "$work/$family-qlora.safetensors" \
            > /dev/null 2>&1 &&
        check "$family: QLoRA compare" timeout 60 "$fsdpctl" compare "$work/$family-qlora.safetensors" \
            "$work/$family-qlora-cpu.safetensors" --rtol 2e-2 > "$out/${family}_qlora_compare.txt" 2>&1
    echo "$family QLoRA: $(tail -1 "$out/${family}_qlora_compare.txt" 2>/dev/null)"
done

# fsdpd trains each family on the GPU: 20 steps of the golden model on random token data
section "fsdpd on $backend: 20 steps of each golden family, full and QLoRA"
"$fsdpctl" synth --out "$work/data.tokens" --records 256 --seq-len 33 --vocab 197 --alphabet 12 --seed 7 > /dev/null
for family in tiny-qwen2 tiny-qwen3 tiny-mistral-sw; do
    for type in full qlora; do
        name=${family}_$type
        cat > "$work/$name.json" <<JSON
{"model": {"path": "$golden/$family", "dtype": "f32"},
 "data": {"path": "$work/data.tokens", "format": "tokens", "seq_len": 33},
 "train": {"type": "$type", "global_batch": 8, "micro_batch": 4, "max_steps": 20, "lr": 1e-3,
           "schedule": "constant", "warmup_steps": 0},
 $( [ $type = qlora ] && echo '"lora": {"rank": 8, "alpha": 16, "dropout": 0, "targets": "all-linear"},' )
 "checkpoint": {"dir": "$work/ck-$name", "resume": "never"},
 "output": {"dir": "$work/out-$name", "consolidate": false},
 "runtime": {"backend": "$backend", "workers_per_node": 1, "metrics": "$out/$name.jsonl"}}
JSON
        check "$name: fsdpd" timeout 180 "$fsdpd" --job "$work/$name.json" > "$out/$name.log" 2>&1
        python3 - "$out/$name.jsonl" "$name" <<'PY' || failed "$name: losses not finite and falling"
import json, math, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
ok = len(l) >= 20 and all(math.isfinite(v) for v in l) and sum(l[-5:]) < sum(l[:5])
print(f"{sys.argv[2]}: {len(l)} steps, loss {l[0]:.4f} -> {l[-1]:.4f}" if l else f"{sys.argv[2]}: no losses")
sys.exit(0 if ok else 1)
PY
    done
done
rm -rf "$work"
finish
