#!/usr/bin/env bash
# Packing against padding (F26): tokens/s of real (label) tokens on a text dataset of mixed
# lengths (50 to 2000 words, log-uniform), the same model, batch and steps, one worker.
#   bench/packing.sh BUILD [MODEL_CONFIG] [STEPS] [BACKEND]
# BUILD holds fsdpd, fsdp-worker and fsdpctl; the defaults: configs/models/llama-1.1b.json
# (the sp32k tokenizer's vocabulary), 12 steps, cuda; SEQ (2048) the row length.  Prints each run's figures and the ratio.
set -eu
build=${1:-build} model=${2:-configs/models/llama-1.1b.json} steps=${3:-12} backend=${4:-cuda} seq=${SEQ:-2048}
work=$(mktemp -d /tmp/fsdp-packing.XXXXXX)
python3 - "$work/text.jsonl" <<'PY'
import json, math, random, sys
rng = random.Random(7)
words = ["the", "model", "packs", "rows", "of", "tokens", "into", "documents", "attention", "never",
         "crosses", "a", "boundary", "loss", "falls", "when", "data", "is", "real", "and", "long"]
with open(sys.argv[1], "w") as f:
    for i in range(3000):
        n = int(math.exp(rng.uniform(math.log(50), math.log(2000))))
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n))}) + "\n")
PY
"$build/fsdpctl" tokenize --tokenizer configs/models/tiny-sp32k --data "$work/text.jsonl" --format text \
    --seq-len "$seq" --out "$work/text.tokens" | tail -2
run() { # NAME PACKING
    "$build/fsdpd" --job configs/jobs/tiny-chat.json --model.config="$model" --data.path="$work/text.tokens" \
        --data.format=tokens --data.template= --data.seq_len="$seq" --data.packing="$2" --train.global_batch=8 --train.micro_batch=4 \
        --train.max_steps="$steps" --train.warmup_steps=1 --fsdp.activation_checkpointing=full \
        --runtime.backend="$backend" --runtime.workers_per_node=1 --checkpoint.dir="$work/$1.ckpt" \
        --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false \
        --output.dir="$work/$1.out" --runtime.metrics="$work/$1.jsonl" > "$work/$1.log" 2>&1 ||
        { tail -5 "$work/$1.log"; echo "packing bench: $1 failed"; exit 1; }
    # steady state: the steps after the first two
    python3 - "$work/$1.jsonl" "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
tok = sum(r["tokens"] for r in rows); sec = sum(r["seconds"] for r in rows)
print("%-7s %d steps: %.0f real tokens/s (%.1f real tokens a step, %.3f s a step), loss %.3f -> %.3f"
      % (sys.argv[2], len(rows), tok / sec, tok / len(rows), sec / len(rows), rows[0]["loss"], rows[-1]["loss"]))
open(sys.argv[1] + ".tps", "w").write(str(tok / sec))
PY
}
run padded false
run packed true
python3 -c 'import sys; a=float(open(sys.argv[1]).read()); b=float(open(sys.argv[2]).read()); print("packed / padded real tokens/s: %.2fx" % (b / a))' \
    "$work/padded.jsonl.tps" "$work/packed.jsonl.tps"
rm -rf "$work"
