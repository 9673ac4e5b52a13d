#!/usr/bin/env bash
# LoRA on one GPU beside PEFT + transformers (F27): Llama-2-7B (a random base, as the peer's),
# bf16 base, r 64 (alpha 16, dropout 0) on every linear, seq 2048, batch 4, activation
# checkpointing; tokens/s and peak memory of each, in the same call.
#   bench/lora.sh BUILD PEER_TORCH [STEPS]
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; PEER_TORCH is
# ../shared/bench/peer_torch.py (only its lora configuration is run).  Memory: ours is the
# peak of what the worker allocated (metrics' mem_peak_bytes, k_peak_bytes), the peer's
# torch.cuda.max_memory_allocated(): both the allocator's peak, not the whole device's; the
# device's (nvidia-smi, sampled every 250 ms) is printed beside for both.
set -eu
build=${1:-build} peer=${2:-dev-carry/peer_torch.py} steps=${3:-10}
model=${MODEL:-configs/models/llama2-7b.json} seq=${SEQ:-2048} batch=${BATCH:-4} backend=${BACKEND:-cuda}
work=$(mktemp -d /tmp/fsdp-lora.XXXXXX)
smi() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$work/$1.smi" 2>/dev/null & smi_pid=$!; }
smi_peak() { kill "$smi_pid" 2>/dev/null || true; sort -n "$work/$1.smi" 2>/dev/null | tail -1; }

"$build/fsdpctl" synth --out "$work/data.tokens" --seq-len "$seq" --records $((batch * (steps + 2))) \
    --vocab 32000 --alphabet 64 > /dev/null
smi ours
"$build/fsdpd" --job configs/jobs/tiny-chat.json --model.config="$model" --data.path="$work/data.tokens" \
    --data.format=tokens --data.seq_len="$seq" --train.type=lora --lora.rank=64 --lora.alpha=16 \
    --lora.dropout=0 --lora.targets=all-linear --train.global_batch="$batch" --train.micro_batch="$batch" \
    --train.max_steps="$steps" --train.warmup_steps=1 --train.lr=1e-5 --train.min_lr=0 --fsdp.activation_checkpointing=full \
    --runtime.backend="$backend" --runtime.workers_per_node=1 --checkpoint.dir="$work/ckpt" \
    --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false \
    --output.dir="$work/out" --runtime.metrics="$work/ours.jsonl" --runtime.heartbeat_s=30 \
    > "$work/ours.log" 2>&1 || { tail -5 "$work/ours.log"; echo "lora bench: fsdpd failed"; exit 1; }
ours_smi=$(smi_peak ours)
python3 - "$work/ours.jsonl" "$ours_smi" "$batch" "$seq" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steady = rows[2:]  # after the first two steps
tok = int(sys.argv[3]) * int(sys.argv[4]) * len(steady)  # batch x seq a step, as the peer counts
sec = sum(r["seconds"] for r in steady)
peak = max(r["mem_peak_bytes"] for r in rows)
print("fsdpd  %d steps: %.0f tokens/s (%.3f s a step), peak allocated %.1f GiB, device %s MiB, loss %.3f -> %.3f"
      % (len(steady), tok / sec, sec / len(steady), peak / 2**30, sys.argv[2], rows[0]["loss"], rows[-1]["loss"]))
PY
smi peer
python3 - "$peer" "$batch" "$seq" > "$work/peer.json" 2> "$work/peer.err" <<'PY' || { tail -5 "$work/peer.err"; echo "lora bench: the peer failed"; exit 1; }
import sys
src = open(sys.argv[1]).read().split("\nfor args in")[0]  # the definitions, not its list of runs
exec(compile(src, sys.argv[1], "exec"))
run("llama2-7b", "lora", int(sys.argv[2]), int(sys.argv[3]))
PY
peer_smi=$(smi_peak peer)
python3 - "$work/peer.json" "$peer_smi" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
print("peer   PEFT + transformers: %.0f tokens/s (%.3f s a step), peak allocated %.1f GiB, device %s MiB, loss %.3f"
      % (r["tokens_per_s"], r["step_s"], r["peak_mem_gib"], sys.argv[2], r["loss"]))
PY
rm -rf "$work"
