#!/usr/bin/env bash
# LoRA on one GPU beside PEFT + transformers (F27): Llama-2-7B (a random base, as the peer's),
# bf16 base, r 64 (alpha 16, dropout 0) on every linear, seq 2048, batch 4, activation
# checkpointing; tokens/s and peak memory of each, in the same call.
#   bench/lora.sh BUILD PEER_TORCH [STEPS]
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; PEER_TORCH is
# ../shared/bench/peer_torch.py (only its lora configuration is run).  CKPT: ours'
# fsdp.activation_checkpointing (full); PEER_CKPT 0: the peer without gradient checkpointing
# (its fastest setting when it fits); PEER=0: ours only.  Memory: ours is the
# peak of what the worker allocated (metrics' mem_peak_bytes, k_peak_bytes), the peer's
# torch.cuda.max_memory_allocated(): both the allocator's peak, not the whole device's; the
# device's (nvidia-smi, sampled every 250 ms) is printed beside for both.
set -eu
build=${1:-build} peer=${2:-dev-carry/peer_torch.py} steps=${3:-10}
model=${MODEL:-configs/models/llama2-7b.json} seq=${SEQ:-2048} batch=${BATCH:-4} backend=${BACKEND:-cuda}
. "$(dirname "$0")/lora_common.sh"

ours lora || exit 1
[ "${PEER:-1}" = 0 ] && exit 0
smi peer
python3 - "$peer" "$batch" "$seq" "${PEER_CKPT:-1}" > "$work/peer.json" 2> "$work/peer.err" <<'PY' || { smi_stop; tail -5 "$work/peer.err"; echo "lora bench: the peer failed"; exit 1; }
import sys
src = open(sys.argv[1]).read().split("\nfor args in")[0]  # the definitions, not its list of runs
exec(compile(src, sys.argv[1], "exec"))
run("llama2-7b", "lora", int(sys.argv[2]), int(sys.argv[3]), ckpt=sys.argv[4] != "0")
PY
peer_smi=$(smi_peak peer)
python3 - "$work/peer.json" "$peer_smi" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
print("peer   PEFT + transformers (gradient checkpointing %s): %.0f tokens/s (%.3f s a step), peak allocated %.1f GiB, device %s MiB, loss %.3f"
      % (r["ckpt"], r["tokens_per_s"], r["step_s"], r["peak_mem_gib"], sys.argv[2], r["loss"]))
PY
