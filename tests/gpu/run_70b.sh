#!/usr/bin/env bash
# F29 on one GPU: Llama-2-70B QLoRA as fsdp_qlora runs it (a random base quantized to NF4 with
# double quantization, r 64 / alpha 16 on every linear, seq 2048, batch 2 a worker, activation
# checkpointing, synthetic tokens), each run bounded by a timeout; logs land in $OUT.
#
#   tests/gpu/run_70b.sh BUILD [one|two|offload7b ...]
#
#   one        1 worker, no cap: tokens/s, peak GPU memory, host RAM;
#   one-auto   the same with fsdp.activation_checkpointing=auto (a 70B NF4 base leaves room to
#              keep activations: what the plan picks);
#   two        2 workers sharing the GPU (fsdp_qlora's two 24 GB cards), each capped at
#              runtime.gpu_memory_limit=22GiB, with fsdp.cpu_offload and fsdp.offload_params:
#              peak GPU memory a worker, host RAM, the loss falling.  NCCL refuses two ranks
#              on one GPU, so they talk through host memory: their tokens/s is no fabric figure;
#   one-capped 1 worker capped at 22 GiB with both offloads: the 70B on one 24 GB card;
#   offload7b  Llama-2-7B QLoRA (batch 4) with and without offload: losses within 2e-2, and
#              the speed of each.
# MODEL70 names another model config for the 70B runs (one with fewer layers, e.g. 16: each
# layer's copy and compute as the 70B's, a fifth of the load).
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
model70=${MODEL70:-configs/models/llama2-70b.json}
. tests/gpu/lib.sh
trap 'unsample; rm -rf "$work"' EXIT
for r in $runs; do
    case $r in
    one)
        section "70B QLoRA, 1 worker, no cap"
        measured_run one "$model70" qlora 1 8 2 560 ;;
    one-auto)
        section "70B QLoRA, 1 worker, no cap, activation checkpointing auto"
        measured_run one-auto "$model70" qlora 1 8 2 560 --fsdp.activation_checkpointing=auto
        grep -m1 "activation checkpointing" "$out/one-auto.log" | cut -c1-200 ;;
    two)
        section "70B QLoRA, 2 workers on one GPU, runtime.gpu_memory_limit=22GiB each, offloaded"
        measured_run two "$model70" qlora 2 8 2 580 --runtime.gpu_memory_limit=22GiB \
            --fsdp.cpu_offload=true --fsdp.offload_params=true --train.lr=1e-3 ;;
    one-capped)
        section "70B QLoRA, 1 worker capped at runtime.gpu_memory_limit=22GiB, offloaded (one 24 GB card)"
        measured_run one-capped "$model70" qlora 1 6 2 560 --runtime.gpu_memory_limit=22GiB \
            --fsdp.cpu_offload=true --fsdp.offload_params=true --train.lr=1e-3 ;;
    offload7b)
        section "7B QLoRA, 1 worker: offloaded and not"
        measured_run q7 configs/models/llama2-7b.json qlora 1 8 4 200 &&
            measured_run q7off configs/models/llama2-7b.json qlora 1 8 4 200 --fsdp.cpu_offload=true --fsdp.offload_params=true &&
            losses q7 q7off 2e-2 ;;
    *) failed "unknown run '$r'" ;;
    esac
done
finish
