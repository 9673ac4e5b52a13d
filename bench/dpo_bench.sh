#!/usr/bin/env bash
# DPO on one GPU beside TRL's DPOTrainer + PEFT (F49), in one call: Llama-2-7B (a random bf16
# base, as the peers of bench/lora.sh), LoRA r 64 (alpha 16, dropout 0) on every linear (q, k,
# v, o, gate, up, down, as lora.sh), sigmoid DPO (beta 0.1), PAIRS (2) pairs a step of PROMPT
# (512) + COMPLETION (1536) tokens on both sides (random ids, seed 0; every completion ends in
# EOS, so TRL adds none), activation checkpointing, the reference = the adapters off on both.
#
#   bench/dpo_bench.sh BUILD PEER_TORCH          (from the repository root; logs and table in $OUT)
#
# BUILD holds fsdpd and fsdpctl built with CUDA; PEER_TORCH is ../shared/bench/peer_torch.py
# (the random 7B's configuration comes from it).  fsdpd: a cache of pairs (fsdpctl tokenize
# --from-safetensors --pairs) from a safetensors this script writes, train.objective dpo.  The
# peer: bench/peer_dpo.py (bf16, gradient checkpointing, precompute_ref_log_probs False, SDPA),
# with TRL 1.16.0 from the carried wheel dev-carry/wheels (carry dev-carry) and the datasets
# stub of tests/golden_gen.  Tokens a step, the same count on both sides: PAIRS x 2 rows x
# (PROMPT + COMPLETION), prompt, chosen and rejected tokens of both rows.  STEPS (8) steps, the
# mean over those after the first 3.  Memory: each side's allocator peak (fsdpd's metrics
# mem_peak_bytes, the peer's max_memory_allocated) and the largest process's nvidia-smi peak
# (tests/gpu/lib.sh sample, every 500 ms).  Each run has a timeout cut to what is left of
# BUDGET_S (560 s); one with less than 30 s left is skipped (counted).  BACKEND=cpu: the tiny
# model (configs/models/tiny.json), PROMPT 32 + COMPLETION 96, the peer skipped unless PEER=1
# (tests/integration/test_dpo_bench.sh, with PEER_PY a stand-in).  Exit 1 when a run failed.
set -u
build=${1:-build} peer_torch=${2:-dev-carry/peer_torch.py}
out=${OUT:-/tmp/fsdp-dpo-bench-out}
backend=${BACKEND:-cuda}
steps=${STEPS:-8} warm=3 pairs=${PAIRS:-2}
peer_py=${PEER_PY:-bench/peer_dpo.py}
budget_end=$((SECONDS + ${BUDGET_S:-560}))
if [ "$backend" = cpu ]; then
    model=configs/models/tiny.json prompt=${PROMPT:-32} completion=${COMPLETION:-96}
else
    model=${MODEL:-configs/models/llama2-7b.json} prompt=${PROMPT:-512} completion=${COMPLETION:-1536}
fi
seq=$((prompt + completion))
work=$(mktemp -d /tmp/fsdp-dpo-bench.XXXXXX)
mkdir -p "$out"
. tests/gpu/lib.sh
trap 'unsample; rm -rf "$work"' EXIT
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines (KINDS.md)
[ "$steps" -gt "$warm" ] || { echo "dpo_bench.sh: STEPS must be more than $warm"; exit 1; }
tokens_a_step=$((pairs * 2 * seq))
section "DPO bench: $model, $pairs pairs a step of $prompt + $completion tokens ($tokens_a_step tokens a step, both rows), $steps steps, backend $backend"

# The pairs, the same ids for both sides: rows 2i, 2i+1 prompt + chosen, prompt + rejected.
vocab=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model") || exit 1
python3 bench/peer_dpo.py --write-pairs "$work/pairs.safetensors" --pairs $((pairs * steps)) \
    --prompt "$prompt" --completion "$completion" --vocab "$vocab" || { failed "the pairs"; finish; }
"$build/fsdpctl" tokenize --from-safetensors "$work/pairs.safetensors" --pairs --vocab "$vocab" \
    --out "$work/pairs.tokens" > "$work/tokenize.log" 2>&1 || { cat "$work/tokenize.log"; failed "fsdpctl tokenize --pairs"; finish; }

# figures NAME ROWS_JSONL_OR_PEER_JSON SIDE: one line of the table and $out/NAME.fig
figures() {
    python3 - "$out/$1" "$1" "$tokens_a_step" "$warm" "$(gpu_peaks "$1")" "$2" <<'PY'
import json, sys
base, name, tok, warm, gpu, side = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6]
if side == "fsdpd":
    rows = [json.loads(l) for l in open(base + ".jsonl")]
    steady = rows[warm:]
    step_s = sum(r["seconds"] for r in steady) / len(steady)
    fig = dict(step_s=step_s, tokens_per_s=tok / step_s, own_peak_gib=max(r["mem_peak_bytes"] for r in rows) / 2**30,
               loss=rows[-1]["loss"], timed_steps=len(steady))
else:
    # the peer's figures: its last JSON line (the Trainer also prints its logs as Python dicts)
    r = [json.loads(l) for l in open(base + ".log") if l.startswith('{"')][-1]
    fig = dict(step_s=r["step_s"], tokens_per_s=r["tokens_per_s"], own_peak_gib=r["peak_mem_gib"], loss=r["loss"],
               timed_steps=r["timed_steps"])
    if r["tokens_a_step"] != tok:
        sys.exit(f"{name}: the peer counted {r['tokens_a_step']} tokens a step, fsdpd {tok}")
fig["gpu_mib"] = max(gpu) if gpu else None
json.dump(fig, open(base + ".fig", "w"))
print(f"{side:6} {fig['tokens_per_s']:9.0f} tokens/s  {fig['step_s']:.3f} s a step ({fig['timed_steps']} timed)  "
      f"peak allocated {fig['own_peak_gib']:.2f} GiB  GPU {fig['gpu_mib']} MiB  loss {fig['loss']:.4f}")
PY
}

section "fsdpd"
lim=$(run_limit 300)
if [ "$lim" -lt 30 ]; then
    skipped "fsdpd: ${lim}s left of BUDGET_S"
else
    sample dpo_fsdpd
    timeout "$lim" "$build/fsdpd" --job configs/jobs/tiny-chat.json --model.path= --model.init=random \
        --model.config="$model" --model.dtype=bf16 --data.path="$work/pairs.tokens" --data.format=tokens \
        --data.template= --data.seq_len="$seq" --data.shuffle=false --train.type=lora --lora.rank=64 --lora.alpha=16 \
        --lora.dropout=0 --lora.targets=all-linear --train.objective=dpo --train.dpo_beta=0.1 \
        --train.global_batch="$pairs" --train.micro_batch="$pairs" --train.max_steps="$steps" \
        --train.warmup_steps=1 --train.lr=1e-5 --train.min_lr=0 --fsdp.activation_checkpointing=full \
        --runtime.backend="$backend" --runtime.workers_per_node=1 --checkpoint.dir="$work/ckpt" \
        --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false \
        --output.dir="$work/run" --runtime.metrics="$out/dpo_fsdpd.jsonl" --runtime.heartbeat_s=30 \
        > "$out/dpo_fsdpd.log" 2>&1
    rc=$?
    unsample
    if [ "$rc" -ne 0 ]; then
        grep -v '^step' "$out/dpo_fsdpd.log" | tail -8
        failed "fsdpd: exit $rc"
    else
        figures dpo_fsdpd fsdpd || failed "fsdpd: no figures"
    fi
fi

section "peer: TRL DPOTrainer + PEFT"
lim=$(run_limit 300)
if [ "$backend" = cpu ] && [ "${PEER:-0}" != 1 ]; then
    skipped "peer: TRL's DPOTrainer needs CUDA (BACKEND=cpu)"
elif [ "$lim" -lt 30 ]; then
    skipped "peer: ${lim}s left of BUDGET_S"
else
    sample dpo_peer
    PYTHONUNBUFFERED=1 timeout "$lim" python3 "$peer_py" --data "$work/pairs.safetensors" --pairs "$pairs" \
        --steps $((steps - warm)) --warm "$warm" --peer-torch "$peer_torch" --vocab "$vocab" \
        > "$out/dpo_peer.log" 2>&1
    rc=$?
    unsample
    if [ "$rc" -ne 0 ]; then
        tail -8 "$out/dpo_peer.log"
        failed "peer: exit $rc"
    else
        figures dpo_peer peer || failed "peer: no figures"
    fi
fi

section "table"
python3 - "$out" <<'PY' | tee "$out/table.txt"
import json, os, sys
out = sys.argv[1]
f = {s: json.load(open(f"{out}/dpo_{s}.fig")) for s in ("fsdpd", "peer") if os.path.exists(f"{out}/dpo_{s}.fig")}
print("| side | tokens/s | s a step | peak allocated GiB | GPU peak MiB |")
print("| --- | --- | --- | --- | --- |")
for s, x in f.items():
    print(f"| {s} | {x['tokens_per_s']:.0f} | {x['step_s']:.3f} | {x['own_peak_gib']:.2f} | {x['gpu_mib']} |")
if len(f) == 2:
    a, b = f["fsdpd"], f["peer"]
    print(f"fsdpd / peer: {a['tokens_per_s'] / b['tokens_per_s']:.2f}x tokens/s, "
          f"{a['own_peak_gib'] / b['own_peak_gib']:.2f}x peak allocated memory")
else:
    print("fsdpd / peer: not both sides ran")
PY
finish
