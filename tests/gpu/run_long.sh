#!/usr/bin/env bash
# F46 on one GPU: Llama-3.1-8B QLoRA (a random NF4 base, r 64 on every linear, dropout 0,
# batch 1, full recompute), each run bounded by a timeout; every log lands in $OUT.  From the
# repository root:
#
#   tests/gpu/run_long.sh BUILD [bits|speed]
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA.
#   bits (about 4 minutes): at T = 16384 (LONG_T), 3 steps with the layer inputs kept, then with
#     fsdp.offload_activations made to move OFFLOADED (16) of them by runtime.gpu_memory_limit
#     (the plan's total less that many inputs, read from `fsdpctl plan --json`): every step's
#     loss and gradient norm the same bits (the copies move bytes, on the copy stream, overlapped:
#     a missed wait or a wrong ring buffer changes them); then fsdp.mlp_chunk 4096 with the
#     offload: losses within 1e-2 (bf16: the weight gradients summed by chunk);
#   speed (about 5 minutes): at T = 32768 (SPEED_T), 6 steps kept and 6 with all but the last
#     layer's input on the host: tokens/s after the third step of each, and the goal (F46: the
#     offload costs at most 10%) checked; the peaks (metrics' mem_peak_bytes).
set -u
build=${1:-build} part=${2:-bits}
out=${OUT:-/tmp/fsdp-gpu-out} backend=cuda
work=$(mktemp -d /tmp/fsdp-long.XXXXXX)
mkdir -p "$out"
fsdpd="$build/fsdpd" fsdpctl="$build/fsdpctl"
. tests/gpu/lib.sh
trap 'rm -rf "$work"' EXIT
long_t=${LONG_T:-16384} speed_t=${SPEED_T:-32768} offloaded=${OFFLOADED:-16}

# run NAME T STEPS overrides...: one QLoRA run at T tokens a step on synthetic tokens.
run() {
    local name=$1 T=$2 steps=$3
    shift 3
    [ -s "$work/data-$T.tokens" ] ||
        "$fsdpctl" synth --out "$work/data-$T.tokens" --seq-len "$T" --records $((steps + 2)) --vocab 32000 \
            --alphabet 64 > /dev/null || { failed "synth at $T"; return 1; }
    rm -f "$out/$name.jsonl"
    timeout "${JOB_TIMEOUT:-280}" "$fsdpd" "${qlora[@]}" --data.path="$work/data-$T.tokens" --data.seq_len="$T" \
        --train.max_steps="$steps" --checkpoint.dir="$work/$name/ckpt" --output.dir="$work/$name/out" \
        --runtime.metrics="$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc; $(grep -o 'fsdp.offload_activations: [0-9]* of [0-9]* layer inputs' "$out/$name.log" | tail -1);" \
         "losses $(step_losses "$name" | tr '\n' ' ')"
    [ $rc -eq 0 ] || { tail -5 "$out/$name.log"; failed "run $name: exit $rc"; }
    return $rc
}
qlora=(--job configs/jobs/tiny-chat.json --model.config=configs/models/llama3.1-8b.json --data.format=tokens
       --data.template= --train.type=qlora --lora.rank=64 --lora.alpha=16 --lora.dropout=0 --lora.targets=all-linear
       --train.global_batch=1 --train.micro_batch=1 --train.warmup_steps=0 --train.lr=1e-4 --train.min_lr=1e-4
       --fsdp.activation_checkpointing=full --runtime.backend=cuda --runtime.workers_per_node=1
       --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false --runtime.heartbeat_s=30)

# limit_for T N: a runtime.gpu_memory_limit under which the plan moves N layer inputs at T.
limit_for() {
    "$fsdpctl" plan "${qlora[@]:1}" --data.path="$work/data-$1.tokens" --data.seq_len="$1" --gpus-per-node 1 \
        --fsdp.offload_activations=true --json > "$work/plan.json" || return 1
    python3 - "$work/plan.json" "$1" "$2" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); T, n = int(sys.argv[2]), int(sys.argv[3])
one = (T * 4096 * 2 + 255) // 256 * 256  # a layer input, bf16, as fsdp carves it
print(p["gpu_memory"]["fsdp"] - n * one)
PY
}

# same_steps A B: every step's loss and grad_norm of two runs, bit for bit.
same_steps() {
    local a b
    a=$(sed -n 's/.*"loss":\([-0-9.e+]*\).*"grad_norm":\([-0-9.e+]*\).*/\1 \2/p' "$out/$1.jsonl")
    b=$(sed -n 's/.*"loss":\([-0-9.e+]*\).*"grad_norm":\([-0-9.e+]*\).*/\1 \2/p' "$out/$2.jsonl")
    [ -n "$a" ] && [ "$a" = "$b" ] && { echo "$1 vs $2: the same loss and gradient norm bits at every step"; return 0; }
    paste <(echo "$a") <(echo "$b")
    failed "$1 vs $2: the steps differ"
}

if [ "$part" = bits ]; then
    section "F46: offload_activations at T=$long_t, the bits of keeping the inputs"
    if run kept "$long_t" 3; then
        limit=$(limit_for "$long_t" "$offloaded") || failed "plan at $long_t"
        run offloaded "$long_t" 3 --fsdp.offload_activations=true --runtime.gpu_memory_limit="$limit" &&
            same_steps kept offloaded
        grep -q "fsdp.offload_activations: $offloaded of 32 layer inputs" "$out/offloaded.log" ||
            failed "the worker did not offload $offloaded layer inputs"
        run chunked "$long_t" 3 --fsdp.offload_activations=true --runtime.gpu_memory_limit="$limit" \
            --fsdp.mlp_chunk=4096 && losses kept chunked 1e-2
    fi
else
    section "F46: offload_activations at T=$speed_t, tokens/s kept and offloaded"
    if run fast "$speed_t" 6; then
        limit=$(limit_for "$speed_t" 31) || failed "plan at $speed_t"
        run moved "$speed_t" 6 --fsdp.offload_activations=true --runtime.gpu_memory_limit="$limit"
        rate fast "$speed_t" 1 | tee "$work/fast.rate"
        rate moved "$speed_t" 1 | tee "$work/moved.rate"
        python3 - "$out/fast.jsonl" "$out/moved.jsonl" <<'PY' || failed "offloading cost more than 10% of tokens/s"
import json, sys
def mean(p):
    r = [json.loads(l) for l in open(p)]
    return sum(x["seconds"] for x in r[3:]) / len(r[3:]), max(x["mem_peak_bytes"] for x in r) / 2**30
(a, pa), (b, pb) = mean(sys.argv[1]), mean(sys.argv[2])
print("kept %.3f s a step (peak %.1f GiB), offloaded %.3f s (peak %.1f GiB): %.1f%% slower" % (a, pa, b, pb, 100 * (b / a - 1)))
sys.exit(b > 1.10 * a)
PY
    fi
fi
finish
