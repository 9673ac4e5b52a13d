#!/usr/bin/env bash
# CPU offload end to end (F29) on the CPU backend, 2 workers:
#  - fsdp.cpu_offload (master and AdamW state on the host, the step on host threads) and
#    fsdp_qlora's --use_cpu_offload (the parameters too) give the bits of the run without,
#    for a full fine-tune, LoRA and QLoRA (fsdp.offload_params: the frozen base streamed from
#    fsdpd's model memory at each use);
#  - an offloaded run's checkpoint resumes, offloaded or not, to the uninterrupted run's bits;
#  - what cannot work is refused, naming why (pinned host memory past the node's: before the
#    model loads).
source "$(dirname "$0")/lib.sh"

write_base_job full

# run NAME [FAULT ...] -- [overrides...]: run_job in a checkpoint directory of its own, the final
# trained tensors in $tmp/NAME.safetensors.
run() {
    local name=$1 faults=()
    shift
    while [ "$1" != -- ]; do faults+=("$1"); shift; done
    shift
    run_job "$name" "final_params=$tmp/$name.safetensors" "${faults[@]+"${faults[@]}"}" -- \
        --checkpoint.dir="$tmp/ck-$name" "$@"
}
same_bits() { # A B [STEPS]: the same losses and the same final tensors, bit for bit
    join "$tmp/$1.loss" "$tmp/$2.loss" > "$tmp/joined"
    [ "$(wc -l < "$tmp/joined")" -ge "${3:-6}" ] || fail "too few common steps in $1 and $2"
    awk '$2 != $3 { bad = 1; print } END { exit bad }' "$tmp/joined" || fail "losses of $1 and $2 differ"
    cmp "$tmp/$1.safetensors" "$tmp/$2.safetensors" || fail "$1 and $2 trained other tensors"
}

# less_memory A B: B's worker held less context memory ("device" memory) than A's
less_memory() {
    local a b
    a=$(sed -n '1s/.*"mem_bytes":\([0-9]*\).*/\1/p' "$tmp/$1.jsonl")
    b=$(sed -n '1s/.*"mem_bytes":\([0-9]*\).*/\1/p' "$tmp/$2.jsonl")
    [ -n "$a" ] && [ -n "$b" ] && [ "$b" -lt "$a" ] || fail "$2 holds $b bytes of context memory, $1 $a"
    echo "context memory a worker: $1 $a bytes, $2 $b bytes"
}

# --- a full fine-tune -------------------------------------------------------------------------
run full --
must_succeed full
run full_off -- --fsdp.cpu_offload=true
must_succeed full_off
same_bits full full_off
less_memory full full_off
run full_qlora_flag -- --use_cpu_offload=true
must_succeed full_qlora_flag
same_bits full full_qlora_flag

# --- crash after step 4 of an offloaded run; resume offloaded, and not ----------------------
run crashed worker=1:exit:4 -- --fsdp.cpu_offload=true
[ "$status" -ne 0 ] || fail "the crashing run succeeded"
[ "$(readlink "$tmp/ck-crashed/latest")" = step-000003 ] || { cat "$tmp/crashed.log"; fail "latest is not step 3"; }
cp -a "$tmp/ck-crashed" "$tmp/ck-resumed_plain"
mv "$tmp/ck-crashed" "$tmp/ck-resumed_off"
run resumed_off -- --fsdp.cpu_offload=true --checkpoint.resume=auto
must_succeed resumed_off
grep -q 'resuming from .*step-000003' "$tmp/resumed_off.log" || fail "the run did not resume"
same_bits full resumed_off 3
run resumed_plain -- --checkpoint.resume=auto
must_succeed resumed_plain
same_bits full resumed_plain 3

# --- LoRA and QLoRA: the base streamed from the model memory ---------------------------------
for type in lora qlora; do
    run $type -- --train.type=$type
    must_succeed $type
    run ${type}_off -- --train.type=$type --use_cpu_offload=true
    must_succeed ${type}_off
    same_bits $type ${type}_off
    run ${type}_params -- --train.type=$type --fsdp.offload_params=true
    must_succeed ${type}_params
    same_bits $type ${type}_params
    less_memory $type ${type}_params
done

# --- refusals ------------------------------------------------------------------------------------
run params_full -- --fsdp.offload_params=true
[ "$status" -ne 0 ] && grep -q "fsdp.offload_params: a full fine-tune's parameters are its master shards" \
    "$tmp/params_full.log" || { cat "$tmp/params_full.log"; fail "offload_params without cpu_offload was not refused"; }
run params_bf16 -- --train.type=lora --fsdp.offload_params=true --model.dtype=bf16
[ "$status" -ne 0 ] && grep -q 'it is streamed as it is: set model.dtype to fp32' "$tmp/params_bf16.log" ||
    { cat "$tmp/params_bf16.log"; fail "a model memory in another dtype than the compute's was streamed"; }
# pinned host memory beyond what the node has: refused before the model loads, the figures named
run host_mem host_memory=1000 -- --fsdp.cpu_offload=true
[ "$status" -ne 0 ] && grep -q "not enough host memory: 2 workers on this node would pin .* bytes; .* GiB each: fsdp.cpu_offload's masters, AdamW state and gradients), and the node has 0.0 GiB (1000 bytes) available (FSDP_FAULTS host_memory)" \
    "$tmp/host_mem.log" || { cat "$tmp/host_mem.log"; fail "pinned host memory past the node's was not refused"; }
! grep -q "started, pid" "$tmp/host_mem.log" || fail "workers started before the host memory was checked"
echo "offload: ok"
