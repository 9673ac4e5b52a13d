#!/usr/bin/env bash
# QLoRA on one GPU beside PEFT + transformers + bitsandbytes (F28): Llama-2-7B (a random base,
# as the peer's) quantized to NF4 with double quantization, bf16 compute, r 64 (alpha 16,
# dropout 0) on every linear, seq 2048, batch 4, activation checkpointing; tokens/s and peak
# memory of each, in the same call.  Ours runs bench/lora.sh's job with train.type qlora (which
# implies NF4: there is no quantization key).
#   bench/qlora.sh BUILD PEER_QLORA [STEPS]
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; PEER_QLORA is
# ../shared/bench/peer_qlora.py (run at its Llama-2-7B configuration), carried as
# dev-carry/peer_qlora.py, or bench/peer_qlora.py (its copy that knows Qwen2, Qwen3 and
# Mistral too, F43): MODEL=configs/models/qwen2.5-7b.json PEER_MODEL=qwen2.5-7b for Qwen2.5-7B.
# CKPT: ours' fsdp.activation_checkpointing (full); PEER_CKPT 0: the peer without gradient
# checkpointing (bench/peer_qlora.py only); PEER=0: ours only.  The device has no bitsandbytes: BNB_SITE (default
# dev-carry/bnb/site, see its README.txt) is put first on PYTHONPATH.  Memory as bench/lora.sh.
set -eu
build=${1:-build} peer=${2:-dev-carry/peer_qlora.py} steps=${3:-10}
model=${MODEL:-configs/models/llama2-7b.json} peer_model=${PEER_MODEL:-llama2-7b} seq=${SEQ:-2048} batch=${BATCH:-4} backend=${BACKEND:-cuda}
bnb_site=${BNB_SITE:-dev-carry/bnb/site}
. "$(dirname "$0")/lora_common.sh"

ours qlora || exit 1
[ "${PEER:-1}" = 0 ] && exit 0
smi peer
no_ckpt=
[ "${PEER_CKPT:-1}" = 0 ] && no_ckpt=--no-ckpt
PYTHONPATH="$bnb_site${PYTHONPATH:+:$PYTHONPATH}" python3 "$peer" --model "$peer_model" --batch "$batch" \
    --seq "$seq" --rank 64 --steps "$steps" $no_ckpt > "$work/peer.json" 2> "$work/peer.err" ||
    { smi_stop; tail -5 "$work/peer.err"; echo "qlora bench: the peer failed"; exit 1; }
peer_smi=$(smi_peak peer)
python3 - "$work/peer.json" "$peer_smi" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
print("peer   PEFT + transformers + bitsandbytes %s (gradient checkpointing %s): %.0f tokens/s (%.3f s a step), peak allocated %.1f GiB, device %s MiB, loss %.3f"
      % (r["bnb"], r.get("ckpt", True), r["tokens_per_s"], r["step_s"], r["peak_mem_gib"], sys.argv[2], r["loss"]))
PY
