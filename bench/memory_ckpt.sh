#!/usr/bin/env bash
# What in-memory checkpoints (F48, checkpoint.memory_interval_steps) cost training, on one GPU:
# the same job twice in one call, memory checkpoints off (0) and on (1: every step at most,
# paced so that each save's stall stays within 1% of the time since the last), a full
# fine-tune of MODEL (random init, bf16 storage), BATCH x 2048 tokens a step, full recompute,
# no disk checkpoint.  Every output line is timestamped as it comes, so the wall time between
# two step lines holds whatever stalled training between them (a save's staging is outside
# every step's own "seconds").  Prints for each run the wall time from step 1 (the first save
# comes after it) to its last step and the tokens/s over it; for the memory run the images (how
# many a rank, their GiB), the first save's line (its staging: training's stall; its sealing, on
# the writer thread), the overhead over the window against the run without, each save seen (a
# step gap past 1.2x the run without's median) and, with two or more, the steady overhead: the
# later saves' stall over the time of the steps between the first and the last (what the pace
# keeps within 1%; STEPS_ON must span two intervals for it: the interval is the first save's
# stall x 100 s).
#
#   bench/memory_ckpt.sh BUILD [STEPS_OFF] [STEPS_ON] [MODEL] [BATCH]
#
# BUILD holds fsdpd, fsdp-worker, fsdpctl built with CUDA.  Defaults: 40 and 40 steps,
# configs/models/llama2-7b.json, 4 sequences: the 7B's 81 GB of masters and AdamW state
# copied over PCIe into the host at each save.  Logs in $OUT (or /tmp/fsdp-memory-bench).
set -u
build=${1:-build}
steps_off=${2:-40} steps_on=${3:-40}
model=${4:-configs/models/llama2-7b.json} batch=${5:-4}
seq=2048
out=${OUT:-/tmp/fsdp-memory-bench}
work=$(mktemp -d /tmp/fsdp-memory-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
"$build/fsdpctl" synth --out "$work/data.tokens" --seq-len "$seq" --records $((batch * (steps_on + steps_off + 2))) \
    --vocab 32000 --alphabet 64 > /dev/null || { echo "memory_ckpt.sh: synth failed"; exit 1; }

# run NAME STEPS MEMORY: the job; its timestamped log in $out/NAME.log.
run() {
    local name=$1 steps=$2 memory=$3
    timeout 560 "$build/fsdpd" --job configs/jobs/tiny-chat.json --model.path= --model.init=random \
        --model.config="$model" --model.dtype=bf16 --data.path="$work/data.tokens" --data.format=tokens \
        --data.template= --data.seq_len="$seq" --train.type=full --train.global_batch="$batch" \
        --train.micro_batch="$batch" --train.max_steps="$steps" --train.warmup_steps=1 --train.lr=2e-4 \
        --train.min_lr=0 --fsdp.activation_checkpointing=full --runtime.backend=cuda --runtime.workers_per_node=1 \
        --checkpoint.dir="$work/ckpt-$name" --checkpoint.resume=never --checkpoint.save_final=false \
        --checkpoint.memory_interval_steps="$memory" --output.consolidate=false --output.dir="$work/out-$name" \
        --runtime.heartbeat_s=30 --runtime.comm_timeout_s=600 2>&1 |
        python3 -u -c 'import sys, time
for line in sys.stdin: sys.stdout.write(f"{time.time():.3f} {line}")' > "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { tail -n 8 "$out/$name.log"; echo "memory_ckpt.sh: $name exited $rc"; return 1; }
}
run off "$steps_off" 0 || exit 1
run on "$steps_on" 1 || exit 1
echo "model $model, $batch x $seq tokens a step, full recompute, one GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
grep -h "in-memory checkpoints" "$out/on.log" | cut -d' ' -f2- | cut -c1-260
grep -h "in-memory checkpoint of step" "$out/on.log" | cut -d' ' -f2- | cut -c1-260
# From each run's step lines (timestamped as they came): the gaps between them.  A save's
# staging stalls training between its step's line and the next: the "on" run's gaps longer than
# the "off" run's median by more than a fifth of it are its saves.  Both windows run from step
# 1's line (the first save comes after step 1) to the last step's.
python3 - "$out/off.log" "$out/on.log" "$((batch * seq))" <<'PY2'
import statistics, sys
def steps(path):
    t = {}
    for line in open(path):
        f = line.split()
        if len(f) > 2 and f[1] == "step": t[int(f[2].split("/")[0])] = float(f[0])
    return t
off, on, tokens = steps(sys.argv[1]), steps(sys.argv[2]), int(sys.argv[3])
def window(t):
    last = max(t)
    return t[last] - t[1], last - 1
gaps_off = [off[k] - off[k - 1] for k in sorted(off) if k - 1 in off]
med = statistics.median(gaps_off)
saves = [(k - 1, on[k] - on[k - 1] - med) for k in sorted(on) if k - 1 in on and on[k] - on[k - 1] > 1.2 * med]
(s_off, n_off), (s_on, n_on) = window(off), window(on)
base = n_on * s_off / n_off
print(f"off: steps 1-{n_off + 1} in {s_off:.2f} s: {s_off / n_off:.3f} s a step (median gap {med:.3f} s), {n_off * tokens / s_off:.0f} tokens/s")
print(f"on:  steps 1-{n_on + 1} in {s_on:.2f} s: {s_on / n_on:.3f} s a step, {n_on * tokens / s_on:.0f} tokens/s; "
      f"against the same steps without: {s_on - base:+.2f} s ({100 * (s_on - base) / base:+.2f}%)")
print("saves seen (a gap past 1.2x the median): " + (", ".join(f"after step {k} +{d:.3f} s" for k, d in saves) or "none"))
if len(saves) >= 2:
    span = saves[-1][0] - saves[0][0]
    stall = sum(d for _, d in saves[1:])
    print(f"steady: {len(saves) - 1} saves in the {span} steps after the first, {stall:.2f} s of stall: "
          f"{100 * stall / (span * med):.2f}% of their steps' time")
PY2
