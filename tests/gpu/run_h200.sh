#!/usr/bin/env bash
# The F12/F13/F16 runs on one GPU, each bounded by a timeout so a failure costs little device
# time; every log lands in $OUT.  From the repository root:
#
#   tests/gpu/run_h200.sh BUILD CARRY
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; CARRY holds peer_torch.py (the
# team's PyTorch peer); the goldens are the working tree's tests/fixtures/golden/tiny-mha.
# BIG_MODEL (default configs/models/llama-1.1b.json), BIG_SEQ (2048), BIG_STEPS (20) and
# BACKEND (cuda) can be changed, e.g. to try the script on a CPU with a small model;
# SKIP_BIG=1 leaves out the big model and the peer.  Every step runs even after one failed;
# the last lines list the failures, and the exit status is 1 when there was one.
set -u
build=${1:-build} carry=${2:-dev-carry}
out=${OUT:-/tmp/fsdp-gpu-out}
backend=${BACKEND:-cuda}
big_model=${BIG_MODEL:-configs/models/llama-1.1b.json}
big_seq=${BIG_SEQ:-2048} big_steps=${BIG_STEPS:-20}
work=$(mktemp -d /tmp/fsdp-gpu.XXXXXX)
mkdir -p "$out"
fsdpd="$build/fsdpd" fsdpctl="$build/fsdpctl"
. tests/gpu/lib.sh

section "device"
[ "$backend" != cuda ] || check "nvidia-smi" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

section "F12: GPU golden (fsdpctl reference --backend cuda vs transformers, rtol 2e-2)"
g=tests/fixtures/golden/tiny-mha
check "golden: fsdpctl reference" timeout 120 "$fsdpctl" reference --backend "$backend" "$g" "$g/batch.safetensors" \
    --out "$work/golden.safetensors" --adamw 1e-3,0.9,0.95,1e-8,0.1 > "$out/golden.log" 2>&1 &&
    check "golden: fsdpctl compare" timeout 60 "$fsdpctl" compare "$work/golden.safetensors" "$g/expected.safetensors" \
        --rtol 2e-2 > "$out/golden_compare.txt" 2>&1
echo "golden: $(tail -1 "$out/golden_compare.txt" 2>/dev/null)"

section "F16: the Trainer golden on the GPU (bf16 compute, fp32 masters: loss 2e-3, grad norm 2e-2, parameters 2e-2)"
FSDP_BUILD="$build" FSDP_GOLDEN_BACKEND="$backend" timeout 240 \
    bash tests/integration/test_train_golden.sh > "$out/train_golden.log" 2>&1
echo "train golden: exit $?"; grep -E "^---|^step|together|compared|FAIL|ok$" "$out/train_golden.log"

section "F12/F13: the tiny job on the GPU, 1 worker and 2 sharing it (TCP through pinned memory)"
check "synth copy.tokens" "$fsdpctl" synth --out "$work/copy.tokens" --seq-len 32 --records 4096 > /dev/null
job tiny1 1 --data.path="$work/copy.tokens" --checkpoint.resume=never --train.micro_batch=8
job tiny2 2 --data.path="$work/copy.tokens" --checkpoint.resume=never

section "F13: a GPU checkpoint resumed on the CPU backend, and the reverse"
job gpu_first 1 --data.path="$work/copy.tokens" --checkpoint.resume=never --train.max_steps=10 --train.micro_batch=8 &&
    check "copy gpu_first's checkpoint" cp -r "$work/gpu_first/ckpt" "$work/to_cpu_ckpt" &&
    BACKEND=cpu job cpu_resume 2 --data.path="$work/copy.tokens" --checkpoint.dir="$work/to_cpu_ckpt" \
        --checkpoint.resume=latest --train.max_steps=20 &&
    resumed cpu_resume
BACKEND=cpu job cpu_first 2 --data.path="$work/copy.tokens" --checkpoint.resume=never --train.max_steps=10 &&
    check "copy cpu_first's checkpoint" cp -r "$work/cpu_first/ckpt" "$work/to_gpu_ckpt" &&
    job gpu_resume 1 --data.path="$work/copy.tokens" --checkpoint.dir="$work/to_gpu_ckpt" \
        --checkpoint.resume=latest --train.max_steps=20 --train.micro_batch=8 &&
    resumed gpu_resume

if [ -z "${SKIP_BIG:-}" ]; then
section "F13: $big_model, seq $big_seq, $big_steps steps, activation checkpointing: 1 worker, then 2 sharing the GPU"
check "synth big.tokens" "$fsdpctl" synth --out "$work/big.tokens" --seq-len "$big_seq" --records 512 --alphabet 64 > /dev/null
big=(--model.init=random --model.config="$big_model" --data.path="$work/big.tokens" --data.seq_len="$big_seq"
     --train.global_batch=8 --train.max_steps="$big_steps" --train.lr=3e-4 --train.warmup_steps=2
     --fsdp.activation_checkpointing=full --checkpoint.resume=never --runtime.heartbeat_s=30)
mem big1
JOB_TIMEOUT=400 job big1 1 "${big[@]}" --train.micro_batch=8
echo "big1: peak GPU memory $(peak big1) MiB (nvidia-smi, whole device)"
rate big1 $((8 * big_seq)) 1
JOB_TIMEOUT=400 job big2 2 "${big[@]}" --train.micro_batch=4
losses big1 big2

section "F13: consolidation of the big run, then fsdpctl reference --backend cuda on it"
check "batch.safetensors (python3, numpy, safetensors)" python3 - "$work/batch.safetensors" <<'PY'
import sys, numpy as np
from safetensors.numpy import save_file
ids = (np.arange(2 * 64, dtype=np.int32).reshape(2, 64) * 7919) % 32000
save_file({"input_ids": ids, "labels": ids.copy()}, sys.argv[1])
PY
check "reference on the consolidated output ($backend)" timeout 120 "$fsdpctl" reference --backend "$backend" \
    "$work/big1/out" "$work/batch.safetensors" --out "$work/big_ref_gpu.safetensors" > "$out/big_ref_gpu.log" 2>&1
echo "reference on the consolidated output ($backend): $(tail -1 "$out/big_ref_gpu.log")"
check "reference on the consolidated output (cpu)" timeout 200 "$fsdpctl" reference --backend cpu \
    "$work/big1/out" "$work/batch.safetensors" --out "$work/big_ref_cpu.safetensors" > "$out/big_ref_cpu.log" 2>&1
echo "reference on the consolidated output (cpu): $(tail -1 "$out/big_ref_cpu.log")"
check "compare the references ($backend vs cpu)" "$fsdpctl" compare "$work/big_ref_gpu.safetensors" \
    "$work/big_ref_cpu.safetensors" --rtol 2e-2 > "$out/big_ref_compare.txt" 2>&1
grep -E "^logits|^loss|compared" "$out/big_ref_compare.txt"

fi

section "the PyTorch peer, same device call (peer_torch.py, its 1.1B mixed-precision configuration only)"
if [ -f "$carry/peer_torch.py" ] && [ -z "${SKIP_BIG:-}" ]; then
    sed 's/^for args in \[.*\]:$/for args in [("llama-1.1b","mixed",8,2048)]:/' "$carry/peer_torch.py" > "$work/peer.py"
    PYTHONUNBUFFERED=1 timeout 240 python3 "$work/peer.py" > "$out/peer.log" 2>&1 || failed "the PyTorch peer: exit $?"
    grep -v Warning "$out/peer.log"
fi
rm -rf "$work"
finish
