# What bench/lora.sh and bench/qlora.sh share (sourced, not run): the work folder, the device
# memory sampler and our side of the bench.  The sourcing script sets build, steps, model, seq,
# batch and backend first.
work=$(mktemp -d /tmp/fsdp-lora.XXXXXX)
smi_pid=
trap 'smi_stop; rm -rf "$work"' EXIT
# nvidia-smi's memory.used every 250 ms into $work/NAME.smi, until smi_peak NAME prints its peak.
smi() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$work/$1.smi" 2>/dev/null & smi_pid=$!; }
smi_stop() { if [ -n "$smi_pid" ]; then kill "$smi_pid" 2>/dev/null || true; smi_pid=; fi; }
smi_peak() { smi_stop; sort -n "$work/$1.smi" 2>/dev/null | tail -1; }

# ours TYPE: fsdpd training TYPE (lora or qlora) adapters of r 64 (alpha 16, dropout 0) on every
# linear of a random base, one worker, activation checkpointing CKPT (default full; auto,
# selective, none) and EXTRA (more --section.key=value flags, e.g. runtime.gpu_memory_limit),
# on synthetic tokens; prints tokens/s after the first two steps and the peaks (metrics'
# mem_peak_bytes, nvidia-smi's).
ours() {
    "$build/fsdpctl" synth --out "$work/data.tokens" --seq-len "$seq" --records $((batch * (steps + 2))) \
        --vocab 32000 --alphabet 64 > /dev/null || return 1
    smi ours
    "$build/fsdpd" --job configs/jobs/tiny-chat.json --model.config="$model" --data.path="$work/data.tokens" \
        --data.format=tokens --data.template= --data.seq_len="$seq" --train.type="$1" --lora.rank=64 --lora.alpha=16 \
        --lora.dropout=0 --lora.targets=all-linear --train.global_batch="$batch" --train.micro_batch="$batch" \
        --train.max_steps="$steps" --train.warmup_steps=1 --train.lr=1e-5 --train.min_lr=0 --fsdp.activation_checkpointing="${CKPT:-full}" \
        --runtime.backend="$backend" --runtime.workers_per_node=1 --checkpoint.dir="$work/ckpt" \
        --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false \
        --output.dir="$work/out" --runtime.metrics="$work/ours.jsonl" --runtime.heartbeat_s=30 ${EXTRA:-} \
        > "$work/ours.log" 2>&1 || { smi_stop; tail -5 "$work/ours.log"; echo "$1 bench: fsdpd failed"; return 1; }
    local ours_smi
    ours_smi=$(smi_peak ours)
    [ -z "${METRICS_OUT:-}" ] || cp "$work/ours.jsonl" "$METRICS_OUT" # each step's figures, for a caller to compare
    python3 - "$work/ours.jsonl" "$ours_smi" "$batch" "$seq" "$1" "${CKPT:-full}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steady = rows[2:]  # after the first two steps
tok = int(sys.argv[3]) * int(sys.argv[4]) * len(steady)  # batch x seq a step, as the peer counts
sec = sum(r["seconds"] for r in steady)
peak = max(r["mem_peak_bytes"] for r in rows)
print("fsdpd  %s (checkpointing %s), %d steps: %.0f tokens/s (%.3f s a step), peak allocated %.1f GiB, device %s MiB, loss %.3f -> %.3f"
      % (sys.argv[5], sys.argv[6], len(steady), tok / sec, sec / len(steady), peak / 2**30, sys.argv[2], rows[0]["loss"], rows[-1]["loss"]))
PY
}
