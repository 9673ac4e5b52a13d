#!/usr/bin/env bash
# Long sequences on one GPU (F46): one QLoRA step (r 64, alpha 16, dropout 0, every linear, a
# random NF4 base, batch 1) at each given length T, with full recompute, fsdp.offload_activations
# (the layer inputs that do not fit go to pinned host memory) and fsdp.mlp_chunk (MLP_CHUNK
# tokens at a time); for each T: what `fsdpctl plan` predicts (fits, device GiB, layer inputs
# offloaded; at the end the longest length it admits, `--longest`), then fsdpd's step (seconds, tokens/s, its peak allocated, nvidia-smi's peak), and
# with PEER=1 transformers + PEFT + bitsandbytes with gradient checkpointing at the same T in the
# same call (bench/peer_qlora_long.py, a copy of ../shared/bench/peer_qlora.py that knows
# Llama-3.1-8B and reports an out-of-memory step).  One line a run on stdout and in
# $OUT/long_context.tsv.
#   OUT=$OUT bash bench/long_context.sh BUILD T [T...]
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA.  MODEL (configs/models/llama3.1-8b.json;
# llama3.1-70b.json for the 70B: its random NF4 base loads in about 4 minutes, so one T a call)
# is copied with its llama3 rope_scaling factor raised so that factor x 8192 covers T (fsdpd
# refuses a data.seq_len beyond what the config's positions cover; the throughput does not
# depend on the factor).  MLP_CHUNK (16384; 0: off), OFFLOAD (true), PEER (1 with the 8B),
# PEER_SCRIPT (bench/peer_qlora_long.py), BNB_SITE (dev-carry/bnb/site, first on PYTHONPATH for
# the peer, as bench/qlora.sh), EXTRA (more fsdpd overrides, split on spaces: e.g.
# --runtime.gpu_memory_limit=125GiB to keep headroom under the plan), TIMEOUT_S (a run's limit, 540: a step longer than that, as
# `fsdpctl plan` predicts for the 8B at 400k, shows as "timeout" with the device peak it
# reached).  BACKEND=cpu MODEL=... tries the
# logic on a CPU (no peer, no nvidia-smi).
set -u
build=${1:?usage: bench/long_context.sh BUILD T [T...]}
shift
[ $# -gt 0 ] || { echo "bench/long_context.sh: give at least one length T" >&2; exit 2; }
model=${MODEL:-configs/models/llama3.1-8b.json} mlp_chunk=${MLP_CHUNK:-16384} offload=${OFFLOAD:-true}
backend=${BACKEND:-cuda} timeout_s=${TIMEOUT_S:-540} bnb_site=${BNB_SITE:-dev-carry/bnb/site}
peer_script=${PEER_SCRIPT:-bench/peer_qlora_long.py}
case "$model" in *8b*) peer=${PEER:-1} ;; *) peer=${PEER:-0} ;; esac
[ "$backend" = cuda ] || peer=0
out=${OUT:-/tmp}
mkdir -p "$out"
work=$(mktemp -d /tmp/fsdp-long.XXXXXX)
smi_pid=
smi_stop() { if [ -n "$smi_pid" ]; then kill "$smi_pid" 2>/dev/null || true; wait "$smi_pid" 2>/dev/null; smi_pid=; fi; }
trap 'smi_stop; rm -rf "$work"' EXIT
smi() {
    : > "$work/$1.smi"
    [ "$backend" = cuda ] || return 0
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$work/$1.smi" 2>/dev/null & smi_pid=$!
}
smi_peak() { smi_stop; sort -n "$work/$1.smi" 2>/dev/null | tail -1; }
tsv=$out/long_context.tsv
printf 'side\tT\tstatus\tseconds\ttokens_per_s\tpeak_alloc_gib\tdevice_mib\tnote\n' > "$tsv"
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$tsv"; printf '%-6s T=%-7s %-10s %8s s %9s tok/s  peak %6s GiB  device %6s MiB  %s\n' "$@"; }

job=(--job configs/jobs/tiny-chat.json --data.format=tokens --data.template= --train.type=qlora --lora.rank=64
     --lora.alpha=16 --lora.dropout=0 --lora.targets=all-linear --train.global_batch=1 --train.micro_batch=1
     --train.max_steps=1 --train.warmup_steps=0 --train.lr=1e-5 --train.min_lr=0 --fsdp.activation_checkpointing=full
     --fsdp.offload_activations="$offload" --fsdp.mlp_chunk="$mlp_chunk" --runtime.backend="$backend"
     --runtime.workers_per_node=1 --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false
     --runtime.heartbeat_s=30)
rc=0
for T in "$@"; do
    python3 - "$model" "$T" "$work/model.json" <<'PY' || { echo "cannot write the model config for T=$T"; exit 2; }
import json, math, sys
c = json.load(open(sys.argv[1])); T = int(sys.argv[2])
key = "rope_parameters" if "rope_parameters" in c else "rope_scaling"  # the newer spelling keeps rope_theta inside
r = c.get(key) or {}
if r.get("rope_type", r.get("type", "default")) not in ("llama3", "yarn"):
    r.update(rope_type="llama3", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0,
             original_max_position_embeddings=c["max_position_embeddings"])
orig = r.get("original_max_position_embeddings", c["max_position_embeddings"])
r["factor"] = max(float(r.get("factor", 1.0)), float(math.ceil(T / orig)))
c[key] = r
json.dump(c, open(sys.argv[3], "w"))
PY
    "$build/fsdpctl" synth --out "$work/data.tokens" --seq-len "$T" --records 2 --vocab 32000 --alphabet 64 > /dev/null ||
        { echo "synth failed at T=$T"; exit 2; }
    common=("${job[@]}" --model.config="$work/model.json" --data.path="$work/data.tokens" --data.seq_len="$T"
            --checkpoint.dir="$work/ckpt-$T" --output.dir="$work/out-$T" ${EXTRA:-})
    "$build/fsdpctl" plan "${common[@]:1}" --gpus-per-node 1 --json > "$work/plan.json" 2> "$work/plan.err" ||
        { echo "plan failed at T=$T: $(tail -1 "$work/plan.err")"; }
    python3 - "$work/plan.json" "$T" >> "$work/plan.lines" <<'PY' 2>/dev/null && tail -1 "$work/plan.lines"
import json, sys
p = json.load(open(sys.argv[1])); o = p.get("offload_activations", {})
print("plan   T=%-7s %s: device %.1f GiB, %d layer inputs offloaded (%.1f GiB host), host RAM %.1f GiB, %.0f tokens/s predicted"
      % (sys.argv[2], "fits" if p["fits"] else "DOES NOT FIT", p["gpu_memory"]["total"] / 2**30, o.get("layers", 0),
         o.get("host_bytes", 0) / 2**30, p["host_memory"]["total"] / 2**30, (p.get("step") or {}).get("tokens_per_s", 0)))
PY
    smi ours
    status=ok
    timeout "$timeout_s" "$build/fsdpd" "${common[@]}" --runtime.metrics="$work/ours-$T.jsonl" > "$work/ours-$T.log" 2>&1
    case $? in 0) ;; 124) status=timeout ;; *) status=failed ;; esac # a timeout still says the device peak it reached
    dev=$(smi_peak ours)
    if [ "$status" = ok ] && [ -s "$work/ours-$T.jsonl" ]; then
        python3 - "$work/ours-$T.jsonl" "$T" "${dev:-0}" "$work/ours-$T.log" > "$work/ours.row" <<'PY'
import json, re, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
off = re.findall(r"offload_activations: (\d+ of \d+) layer inputs", open(sys.argv[4]).read())
print("\t".join(["fsdpd", sys.argv[2], "ok", "%.1f" % r["seconds"], "%.0f" % (int(sys.argv[2]) / r["seconds"]),
                 "%.1f" % (r["mem_peak_bytes"] / 2**30), sys.argv[3], "inputs offloaded %s" % (off[-1] if off else "?")]))
PY
        IFS=$'\t' read -r -a f < "$work/ours.row"
        row "${f[@]}"
    else
        rc=1
        row fsdpd "$T" "$status" - - - "${dev:-0}" "$(tail -1 "$work/ours-$T.log" | cut -c1-160)"
        cp "$work/ours-$T.log" "$out/ours-$T.log" 2>/dev/null
    fi
    [ "$peer" = 1 ] || continue
    smi peer
    PYTHONPATH="$bnb_site${PYTHONPATH:+:$PYTHONPATH}" timeout "$timeout_s" python3 "$peer_script" --model llama3.1-8b \
        --batch 1 --seq "$T" --rank 64 --steps 1 > "$work/peer-$T.json" 2> "$work/peer-$T.err" || true
    dev=$(smi_peak peer)
    if python3 - "$work/peer-$T.json" "$T" "${dev:-0}" > "$work/peer.row" 2>/dev/null <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
if r["oom"]:
    print("\t".join(["peer", sys.argv[2], "OOM", "-", "-", "%.1f" % r["peak_mem_gib"], sys.argv[3], "out of memory"]))
else:
    print("\t".join(["peer", sys.argv[2], "ok", "%.1f" % r["step_s"], "%.0f" % r["tokens_per_s"], "%.1f" % r["peak_mem_gib"],
                     sys.argv[3], "bitsandbytes " + r["bnb"]]))
PY
    then
        IFS=$'\t' read -r -a f < "$work/peer.row"
        row "${f[@]}"
    else
        row peer "$T" failed - - - "${dev:-0}" "$(tail -1 "$work/peer-$T.err" | cut -c1-160)"
    fi
done
# the longest length the plan admits for the last T's config (its rope factor covers that T)
"$build/fsdpctl" plan "${common[@]:1}" --gpus-per-node 1 --longest 2>/dev/null | sed -n 's/^longest/plan   longest/p'
exit $rc
