#!/usr/bin/env bash
# The rates table of `fsdpctl plan` measured on this GPU, then the runs its predictions are
# checked against (F32), in one call; logs and the table land in $OUT.
#
#   bench/plan_accuracy.sh BUILD
#
# BUILD holds fsdpd, fsdp-worker, fsdpctl and gpu/plan_rates built with CUDA.  The table
# ($OUT/rates.json; configs/plan/h200.json is the committed H200 run) covers the GEMM and
# attention shapes of Llama 1.1B, 2-7B, 3.1-8B and 2-70B at 2048 to 16384 tokens a micro-batch
# (and attention on one row of 8192 to 65536 tokens).  The
# runs: 1.1B and 7B full fine-tunes, 7B LoRA and QLoRA (r 64 on every linear), one worker,
# activation checkpointing, 8 steps; each prints its step time and peaks (tests/gpu/lib.sh
# measured_run).  When this fsdpctl has `plan`, its prediction for each run follows.
set -u
build=${1:-build}
out=${OUT:-/tmp/fsdp-gpu-out}
work=$(mktemp -d /tmp/fsdp-plan.XXXXXX)
mkdir -p "$out"
. tests/gpu/lib.sh
trap 'unsample; rm -rf "$work"' EXIT

section "rates"
check "plan_rates" timeout 420 "$build/gpu/plan_rates" "$out/rates.json" "$work" 2048,4096,8192,16384 \
    configs/models/llama-1.1b.json configs/models/llama2-7b.json configs/models/llama3.1-8b.json \
    configs/models/llama2-70b.json > "$out/rates.log" 2>&1
grep -vE '^gemm|^attention' "$out/rates.log"

section "the runs"
measured_run full11 configs/models/llama-1.1b.json full 1 8 8 200
measured_run full7 configs/models/llama2-7b.json full 1 8 4 300
measured_run lora7 configs/models/llama2-7b.json lora 1 8 4 200
measured_run qlora7 configs/models/llama2-7b.json qlora 1 8 4 200
finish
