#!/usr/bin/env bash
# What in-memory checkpoints (F48, checkpoint.memory_interval_steps) cost training, on one GPU:
# the same job twice in one call, memory checkpoints off (0) and on (1: every step at most,
# paced so that each save's stall stays within 1% of the time since the last), a full
# fine-tune of MODEL (random init, bf16 storage), BATCH x 2048 tokens a step, full recompute,
# no disk checkpoint.  Every output line is timestamped as it comes, so the wall time between
# two step lines holds whatever stalled training between them (a save's staging is outside
# every step's own "seconds").  Prints for each run: the wall time from step WARM to its last
# step and the tokens/s over it; for the memory run the images (how many a rank, their GiB),
# each save line (the step, its staging: training's stall, its sealing: on the writer
# thread), and the overhead: its wall time over the window against the run without.
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
seq=2048 warm=3
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
# window NAME: "SECONDS STEPS" from step WARM's line to the last step's.
window() {
    awk -v w="$warm" '$2 == "step" { split($3, s, "/"); if (s[1] == w) t0 = $1; if (s[1] > w) { t1 = $1; n = s[1] - w } }
        END { printf "%.3f %d\n", t1 - t0, n }' "$out/$1.log"
}

run off "$steps_off" 0 || exit 1
run on "$steps_on" 1 || exit 1
read -r off_s off_n <<< "$(window off)"
read -r on_s on_n <<< "$(window on)"
tokens=$((batch * seq))
echo "model $model, $batch x $seq tokens a step, full recompute, one GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
grep -h "in-memory checkpoints" "$out/on.log" | cut -d' ' -f2- | cut -c1-260
grep -h "in-memory checkpoint of step" "$out/on.log" | cut -d' ' -f2- | cut -c1-260
awk -v n="$off_n" -v s="$off_s" -v t="$tokens" 'BEGIN { printf "off: steps %d-%d in %.2f s: %.3f s a step, %.0f tokens/s\n", 3, 3 + n, s, s / n, n * t / s }'
awk -v n="$on_n" -v s="$on_s" -v t="$tokens" -v off="$off_s" -v offn="$off_n" 'BEGIN {
    base = n * off / offn
    printf "on:  steps %d-%d in %.2f s: %.3f s a step, %.0f tokens/s; against the same steps without: %+.2f s (%+.2f%%)\n",
        3, 3 + n, s, s / n, n * t / s, s - base, 100 * (s - base) / base }'
