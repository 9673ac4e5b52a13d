#!/usr/bin/env bash
# runtime.gpu_memory_limit (F29) end to end on the CPU backend (whose context memory is
# counted and limited as a GPU's), 2 workers:
#  - a run without a limit reports its peak (metrics mem_peak_bytes); with the limit at that
#    peak the job trains to the end with the same losses, bit for bit;
#  - one byte less and fsdpd refuses the job before loading the model (also when resuming; the
#    worker would refuse it too): non-zero exit, the
#    message names runtime.gpu_memory_limit, the bytes it needs (the peak: the plan is what
#    fsdp allocates) and the settings that would fit (fsdp.cpu_offload among them), which do
#    fit; the same for a LoRA job
#    (its base's staging included);
#  - an allocation outside the plan (the network check of fabric.preflight) is refused by the
#    worker's context itself, naming the limit.
source "$(dirname "$0")/lib.sh"

write_base_job full

# run NAME [overrides...]: run_job of 3 steps, saving no checkpoint unless told.
run() {
    local name=$1
    shift
    run_job "$name" -- --train.max_steps=3 --checkpoint.interval_steps=0 --checkpoint.save_final=false "$@"
}
peak_of() { sed -n 's/.*"mem_peak_bytes":\([0-9]*\).*/\1/p' "$tmp/$1.jsonl" | sort -n | tail -1; }
# refused NAME NEEDLE...: the run failed before its first step, fsdpd's last word (the job's
# failure, relayed from the workers) naming every NEEDLE.
refused() {
    local name=$1 needle
    shift
    [ "$status" -ne 0 ] || { cat "$tmp/$name.log"; fail "run $name was not refused"; }
    [ ! -s "$tmp/$name.loss" ] || fail "run $name trained steps before it was refused"
    grep '^fsdpd: job failed: ' "$tmp/$name.log" > "$tmp/$name.failure" || { cat "$tmp/$name.log"; fail "run $name: no job failure"; }
    for needle in "$@"; do
        grep -qF -- "$needle" "$tmp/$name.failure" || { cat "$tmp/$name.log"; fail "run $name: no '$needle'"; }
    done
}

# --- a full fine-tune: its peak as the limit fits, one byte less does not ----------------------
run free
must_succeed free
peak=$(peak_of free)
[ -n "$peak" ] && [ "$peak" -gt 0 ] || fail "no mem_peak_bytes in the metrics"
run fits --runtime.gpu_memory_limit="$peak"
must_succeed fits
[ "$(wc -l < "$tmp/fits.loss")" -eq 3 ] || fail "the run at its limit did not train 3 steps"
cmp "$tmp/free.loss" "$tmp/fits.loss" || fail "the limit changed the losses"
[ "$(peak_of fits)" -le "$peak" ] || fail "the run allocated past its limit"
run tight --runtime.gpu_memory_limit=$((peak - 1))
refused tight "runtime.gpu_memory_limit: each worker needs" "($peak bytes)" "($((peak - 1)) bytes)" \
    "Each of these alone would fit" "fsdp.activation_checkpointing=full (" "train.micro_batch=2 (" \
    "3 workers (" "fsdp.cpu_offload=true ("
grep -q "train.type=lora (" "$tmp/tight.failure" && fail "LoRA (its 64 MiB staging buffer) cannot fit this limit"
# fsdpd itself refused it (model/step_plan.h), before loading the model or starting a worker
grep -q "model in shared memory\|rank 0: started" "$tmp/tight.log" && fail "the job was refused only after loading the model"
# what the suggestions say fits does fit
run ckpt --runtime.gpu_memory_limit=$((peak - 1)) --fsdp.activation_checkpointing=full
must_succeed ckpt
cmp "$tmp/free.loss" "$tmp/ckpt.loss" || fail "checkpointing under the limit changed the losses"
run micro --runtime.gpu_memory_limit=$((peak - 1)) --train.micro_batch=2
must_succeed micro
run offload --runtime.gpu_memory_limit=$((peak - 1)) --fsdp.cpu_offload=true
must_succeed offload
cmp "$tmp/free.loss" "$tmp/offload.loss" || fail "cpu_offload under the limit changed the losses"

# --- resuming a full fine-tune (no model memory: the checkpoint is read) is checked too --------
run saved --checkpoint.save_final=true --checkpoint.dir="$tmp/ck-saved"
must_succeed saved
run resumed --checkpoint.dir="$tmp/ck-saved" --checkpoint.resume=latest --train.max_steps=4 \
    --runtime.gpu_memory_limit=$((peak - 1))
refused resumed "each worker needs" "($peak bytes)"
grep -q "resuming from" "$tmp/resumed.log" || fail "the run did not resume"

# --- a size far below anything: nothing fits, and the job says so ------------------------------
run tiny --runtime.gpu_memory_limit=1KiB
refused tiny "the limit is 0.0 GiB (1024 bytes)" "No single change of fsdp.activation_checkpointing"

# --- a LoRA job: the plan holds its frozen base and staging buffer -----------------------------
run lora --train.type=lora
must_succeed lora
lora_peak=$(peak_of lora)
run lora_tight --train.type=lora --runtime.gpu_memory_limit=$((lora_peak - 1))
refused lora_tight "each worker needs" "($lora_peak bytes)" "loading the base"
run lora_fits --train.type=lora --runtime.gpu_memory_limit="$lora_peak"
must_succeed lora_fits
cmp "$tmp/lora.loss" "$tmp/lora_fits.loss" || fail "the limit changed the LoRA losses"

# --- the worker's context refuses what the plan does not cover: the network check's 4 MiB ------
run preflight --fabric.preflight=on --runtime.gpu_memory_limit=1MiB
refused preflight "the network check (fabric.preflight): runtime.gpu_memory_limit: allocating 4194304 bytes with 0 in use would pass the limit of 1048576 bytes"
echo "memory_limit: ok"
