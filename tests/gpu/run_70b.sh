#!/usr/bin/env bash
# F29 on one GPU: Llama-2-70B QLoRA as fsdp_qlora runs it (a random base quantized to NF4 with
# double quantization, r 64 / alpha 16 on every linear, seq 2048, batch 2 a worker, activation
# checkpointing, synthetic tokens), each run bounded by a timeout; logs land in $OUT.
#
#   tests/gpu/run_70b.sh BUILD [one|two|offload7b ...]
#
#   one        1 worker, no cap: tokens/s, peak GPU memory, host RAM;
#   two        2 workers sharing the GPU (fsdp_qlora's two 24 GB cards), each capped at
#              runtime.gpu_memory_limit=22GiB, with fsdp.cpu_offload and fsdp.offload_params:
#              peak GPU memory a worker, host RAM, the loss falling.  NCCL refuses two ranks
#              on one GPU, so they talk through host memory: their tokens/s is no fabric figure;
#   offload7b  Llama-2-7B QLoRA (batch 4) with and without offload: losses within 2e-2, and
#              the speed of each.
# A run's figures are one line: "NAME: T tokens/s (S s a step), loss A -> B, peak allocated
# G GiB, GPU per process P MiB, host RAM used +H GiB (shared memory M GiB)".
set -u
build=${1:-build}
shift
runs=${*:-one two}
out=${OUT:-/tmp/fsdp-gpu-out} backend=cuda
work=$(mktemp -d /tmp/fsdp-70b.XXXXXX)
mkdir -p "$out"
fsdpd="$build/fsdpd"
. tests/gpu/lib.sh
samplers=()
trap 'for p in "${samplers[@]+"${samplers[@]}"}"; do kill "$p" 2>/dev/null; done; rm -rf "$work"' EXIT

# sample NAME: GPU memory per process and host memory every 500 ms until unsample.
sample() {
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 500 \
        > "$out/$1.gpu" 2>/dev/null &
    samplers+=($!)
    (while :; do awk '/^MemTotal/ {t=$2} /^MemAvailable/ {a=$2} /^Shmem:/ {s=$2}
                      END {print t - a, s}' /proc/meminfo; sleep 0.5; done) > "$out/$1.host" &
    samplers+=($!)
}
unsample() {
    for p in "${samplers[@]+"${samplers[@]}"}"; do kill "$p" 2>/dev/null; done
    samplers=()
}

# run NAME MODEL WORKERS STEPS BATCH TIMEOUT [overrides...]: QLoRA r 64 of a random MODEL.
run() {
    local name=$1 model=$2 workers=$3 steps=$4 batch=$5 limit=$6
    shift 6
    "$build/fsdpctl" synth --out "$work/data.tokens" --seq-len 2048 --records $((batch * workers * (steps + 1))) \
        --vocab 32000 --alphabet 64 > /dev/null || { failed "$name: synth"; return 1; }
    local base_host
    base_host=$(awk '/^MemTotal/ {t=$2} /^MemAvailable/ {a=$2} END {print t - a}' /proc/meminfo)
    sample "$name"
    rm -f "$out/$name.jsonl"
    timeout "$limit" "$fsdpd" --job configs/jobs/tiny-chat.json --model.path= --model.init=random \
        --model.config="$model" --model.dtype=bf16 --data.path="$work/data.tokens" --data.format=tokens \
        --data.seq_len=2048 --train.type=qlora --lora.rank=64 --lora.alpha=16 --lora.dropout=0 \
        --lora.targets=all-linear --train.global_batch=$((batch * workers)) --train.micro_batch="$batch" \
        --train.max_steps="$steps" --train.warmup_steps=1 --train.lr=2e-4 --train.min_lr=0 \
        --fsdp.activation_checkpointing=full --runtime.backend=cuda --runtime.workers_per_node="$workers" \
        --checkpoint.dir="$work/ckpt-$name" --checkpoint.resume=never --checkpoint.save_final=false \
        --output.consolidate=false --output.dir="$work/out-$name" --runtime.metrics="$out/$name.jsonl" \
        --runtime.heartbeat_s=30 --runtime.comm_timeout_s=600 "$@" > "$out/$name.log" 2>&1
    local rc=$?
    unsample
    [ $rc -eq 0 ] || { grep -v '^step' "$out/$name.log" | tail -8; failed "$name: exit $rc"; return 1; }
    grep -E 'quantized|memory|offload' "$out/$name.log" | grep -v '^step' | cut -c1-220 | head -4
    python3 - "$name" "$out" "$batch" "$workers" "$base_host" <<'PY'
import json, sys, collections
name, out, batch, workers, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
steady = rows[2:] or rows[1:]
sec = sum(r["seconds"] for r in steady)
tok = batch * workers * 2048 * len(steady)
per_pid = collections.defaultdict(int)
for line in open(f"{out}/{name}.gpu"):
    p = [x.strip() for x in line.split(",")]
    if len(p) == 2 and p[1].isdigit(): per_pid[p[0]] = max(per_pid[p[0]], int(p[1]))
host = [tuple(map(int, l.split())) for l in open(f"{out}/{name}.host") if l.strip()]
used = max(h[0] for h in host) - base
shm = max(h[1] for h in host)
print(f"{name}: {tok / sec:.0f} tokens/s ({sec / len(steady):.2f} s a step, {len(steady)} steps after the first "
      f"{len(rows) - len(steady)}), loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, peak allocated "
      f"{max(r['mem_peak_bytes'] for r in rows) / 2**30:.1f} GiB (rank 0), GPU per process "
      f"{sorted(per_pid.values(), reverse=True)} MiB, host RAM used +{used / 2**20:.1f} GiB "
      f"(shared memory {shm / 2**20:.1f} GiB)")
PY
}

for r in $runs; do
    case $r in
    one)
        section "70B QLoRA, 1 worker, no cap"
        run one configs/models/llama2-70b.json 1 8 2 560 ;;
    two)
        section "70B QLoRA, 2 workers on one GPU, runtime.gpu_memory_limit=22GiB each, offloaded"
        run two configs/models/llama2-70b.json 2 8 2 580 --runtime.gpu_memory_limit=22GiB \
            --fsdp.cpu_offload=true --fsdp.offload_params=true --train.lr=1e-3 ;;
    offload7b)
        section "7B QLoRA, 1 worker: offloaded and not"
        run q7 configs/models/llama2-7b.json 1 8 4 200 &&
            run q7off configs/models/llama2-7b.json 1 8 4 200 --fsdp.cpu_offload=true --fsdp.offload_params=true &&
            losses q7 q7off 2e-2 ;;
    *) failed "unknown run '$r'" ;;
    esac
done
finish
