#!/usr/bin/env bash
# In-memory checkpoints on one GPU (F48): the 1.1B model (random init), 2048-token rows, 4 a
# step, a disk checkpoint every 100 steps, 300 steps; once uninterrupted, once with its worker
# killed (-9) once the in-memory checkpoint is past step 100 and runtime.max_restarts=1.  The
# saves are paced (each one's staging stall within 1% of the time since the last: about every
# 170 steps here), so the kill waits for the second, as the leader's memory manifest names it.
# The restart must resume from that in-memory checkpoint (newer than the disk's, step 100: the
# images pinned, staged from the device) and finish; the final parameters are compared with the
# uninterrupted run's (the same bits when the CUDA step is deterministic; otherwise the largest
# difference is printed).  Logs in $OUT.
#
#   tests/gpu/run_memory.sh BUILD
set -u
build=${1:-build}
out=${OUT:-/tmp/fsdp-gpu-out}
work=$(mktemp -d /tmp/fsdp-memory.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
"$build/fsdpctl" synth --out "$work/data.tokens" --seq-len 2048 --records 1300 --vocab 32000 --alphabet 64 > /dev/null ||
    { echo "run_memory.sh: synth failed"; exit 1; }
job=(--job configs/jobs/tiny-chat.json --model.path= --model.init=random --model.config=configs/models/llama-1.1b.json
     --model.dtype=bf16 --data.path="$work/data.tokens" --data.format=tokens --data.template= --data.seq_len=2048
     --train.type=full --train.global_batch=4 --train.micro_batch=4 --train.max_steps=300 --train.warmup_steps=1
     --train.lr=2e-4 --train.min_lr=0 --fsdp.activation_checkpointing=full --runtime.backend=cuda --runtime.workers_per_node=1
     --checkpoint.interval_steps=100 --output.consolidate=false --runtime.heartbeat_s=5)

FSDP_FAULTS="final_params=$work/ref.safetensors" timeout 240 "$build/fsdpd" "${job[@]}" --checkpoint.dir="$work/ref.ckpt" \
    --output.dir="$work/ref.out" > "$out/memory-ref.log" 2>&1 || { tail -n 8 "$out/memory-ref.log"; echo "FAIL: the reference run"; exit 1; }
FSDP_FAULTS="final_params=$work/mem.safetensors" timeout 300 "$build/fsdpd" "${job[@]}" --checkpoint.dir="$work/mem.ckpt" \
    --output.dir="$work/mem.out" --runtime.max_restarts=1 > "$out/memory-kill.log" 2>&1 &
pid=$!
memory_step() { sed -n 's/.*"step": *\([0-9]*\).*/\1/p' "$work/mem.ckpt/memory-manifest.json" 2>/dev/null | head -n 1; }
for _ in $(seq 2400); do [ "$(memory_step)" -gt 100 ] 2>/dev/null && break; sleep 0.1; done
victim=$(sed -n 's/.*rank 0: started, pid \([0-9]*\).*/\1/p' "$out/memory-kill.log" | head -n 1)
killed=$(date +%s.%N)
kill -KILL "$victim"
status=0
wait "$pid" || status=$?
grep -E "in-memory|restart 1|resuming" "$out/memory-kill.log" | cut -c1-240
[ "$status" -eq 0 ] || { tail -n 8 "$out/memory-kill.log"; echo "FAIL: the killed run exited $status"; exit 1; }
step=$(sed -n 's/.*resuming from the in-memory checkpoint of step \([0-9]*\), .*/\1/p' "$out/memory-kill.log" | tail -n 1)
[ -n "$step" ] && [ "$step" -gt 100 ] || { echo "FAIL: not resumed from memory past step 100 (the disk's)"; exit 1; }
echo "resumed from the in-memory checkpoint of step $step (killed at $killed)"
if cmp -s "$work/ref.safetensors" "$work/mem.safetensors"; then
    echo "final parameters: the same bits as the uninterrupted run"
else
    python3 - "$work/ref.safetensors" "$work/mem.safetensors" <<'PY'
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
worst = max((float(abs(a[k] - b[k]).max() / (abs(a[k]).max() + 1e-30)), k) for k in a)
print(f"final parameters differ: largest |a-b|/max|a| {worst[0]:.3e} ({worst[1]})")
PY
fi
echo "run_memory: ok"
