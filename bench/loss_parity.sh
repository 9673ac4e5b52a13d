#!/usr/bin/env bash
# train.precision fp8 against bf16 on real text from the same start (F45 item 4): N records
# of 4,000 characters of the Python standard library's sources (DATA=chat: the chat data of
# `make tiny`, which a 1.1B memorizes), tokenized by fsdpd (the sp32k tokenizer, packed rows of
# SEQ tokens), a random-init MODEL (default Llama-1.1B) trained for
# STEPS steps of BATCH rows in bf16, then in FP8 (tensorwise, FP8 gathers; RUNS="bf16 fp8
# fp8_e5m2" adds FP8 with e5m2 gradients): every loss curve (metrics and SVGs, fsdpctl plot),
# the mean loss of the last 20 steps of each and its difference from bf16's (the goal: within 1%).
#   OUT=$OUT bash bench/loss_parity.sh BUILD [MODEL.json]
# BACKEND=cpu SEQ=64 BATCH=2 STEPS=20 N=400 ... configs/models/tiny.json tries it on a CPU.
set -u
build=${1:?usage: bench/loss_parity.sh BUILD [MODEL.json]}
model=${2:-configs/models/llama-1.1b.json}
out=${OUT:-/tmp/fsdp-loss-parity} work=$(mktemp -d /tmp/fsdp-parity.XXXXXX)
seq=${SEQ:-1024} batch=${BATCH:-8} steps=${STEPS:-300}
mkdir -p "$out"
trap 'rm -rf "$work"' EXIT
export NCCL_NVLS_ENABLE=0
if [ "${DATA:-text}" = chat ]; then # synthetic: a 1.1B learns it to a loss of ~0.01 in 300 steps
    python3 scripts/gen_chat_data.py --out "$work/chat.jsonl" --n "${N:-60000}" > /dev/null || exit 1
    fmt=(--format chat --template llama2)
else # real text: the Python standard library's sources, in file order, 4,000 characters a record
    python3 - "$work/chat.jsonl" "${N:-3000}" <<'PY' || exit 1
import glob, json, os, sys, sysconfig
out, n = open(sys.argv[1], "w"), int(sys.argv[2])
for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True)):
    text = open(path, encoding="utf-8", errors="replace").read()
    for i in range(0, len(text), 4000):
        out.write(json.dumps({"text": text[i:i + 4000]}) + "\n")
        n -= 1
        if n == 0: sys.exit(0)
PY
    fmt=(--format text)
fi
"$build/fsdpctl" tokenize --tokenizer configs/models/tiny-sp32k --data "$work/chat.jsonl" "${fmt[@]}" \
    --seq-len "$seq" --out "$work/chat.tokens" | tail -2 || exit 1
for p in ${RUNS:-bf16 fp8}; do
    t0=$(date +%s)
    case $p in
    bf16 | fp8) flags=(--train.precision="$p") ;;
    fp8_e5m2) flags=(--train.precision=fp8 --train.fp8_grad_format=e5m2) ;;
    *) echo "RUNS: '$p' is not bf16, fp8 or fp8_e5m2"; exit 1 ;;
    esac
    rm -f "$out/parity_$p.jsonl"
    "$build/fsdpd" --job configs/jobs/tiny-chat.json --model.path= --model.init=random --model.config="$model" \
        --model.dtype=bf16 --data.path="$work/chat.tokens" --data.format=tokens --data.template= --data.packing=true \
        --data.seq_len="$seq" --train.global_batch="$batch" --train.micro_batch="$batch" --train.max_steps="$steps" \
        --train.warmup_steps=$((steps / 10)) --train.lr=3e-4 --train.min_lr=3e-5 --train.seed=7 \
        "${flags[@]}" --fsdp.activation_checkpointing=full --runtime.backend="${BACKEND:-cuda}" \
        --runtime.workers_per_node=1 --checkpoint.dir="$work/ckpt-$p" --checkpoint.resume=never \
        --checkpoint.save_final=false --output.consolidate=false --output.dir="$work/out-$p" \
        --runtime.metrics="$out/parity_$p.jsonl" > "$out/parity_$p.log" 2>&1 ||
        { tail -5 "$out/parity_$p.log"; echo "$p: the run failed"; exit 1; }
    echo "$p: $steps steps in $(($(date +%s) - t0)) s"
    "$build/fsdpctl" plot "$out/parity_$p.jsonl" --out "$out/parity_$p.svg" > /dev/null
done
python3 - "$out" ${RUNS:-bf16 fp8} <<'PY'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
curves = {r: [json.loads(l)["loss"] for l in open(f"{out}/parity_{r}.jsonl")] for r in runs}
last = {r: sum(x[-20:]) / len(x[-20:]) for r, x in curves.items()}
n = len(curves[runs[0]])
print("step      " + "  ".join(f"{s:>6}" for s in range(0, n, max(1, n // 10))))
for r, x in curves.items():
    print(f"{r:<9} " + "  ".join(f"{x[s]:6.3f}" for s in range(0, len(x), max(1, len(x) // 10))))
base = last["bf16"]
for r in runs:
    if r == "bf16": continue
    d = (last[r] - base) / base
    print(f"mean loss of the last 20 steps: bf16 {base:.4f}, {r} {last[r]:.4f}: {100 * d:+.2f}% "
          f"({'within' if abs(d) <= 0.01 else 'NOT within'} 1%)")
PY
