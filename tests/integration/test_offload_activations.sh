#!/usr/bin/env bash
# fsdp.offload_activations end to end (F46) on the CPU backend, 2 workers, a 4-layer model:
#  - the worker moves as many layer inputs to host memory as runtime.gpu_memory_limit makes it
#    (the fewest that fit), the number `fsdpctl plan` shows, and says so;
#  - the run's losses and trained tensors are the bits of full recompute without offload
#    (the CPU backend's host and device memory are one, but the buffers and copies are the
#    GPU's: a wrong ring slot or a missing fetch changes the bits).  A full fine-tune: an
#    adapter job's peak on this small model is the base's loading (a 64 MiB staging buffer),
#    which no offload lowers; tests/unit/test_lora.c runs LoRA and QLoRA offloaded;
#  - its context memory is smaller by one layer input each, as the plan says;
#  - fsdp_qlora's --use_activation_cpu_offload maps to it; without full recompute it is refused;
#  - fsdp.mlp_chunk (the MLP 7 tokens at a time, with the inputs offloaded too): the first
#    step's loss the same bits, the others within fp32 rounding, less context memory, as the
#    plan says.
source "$(dirname "$0")/lib.sh"

write_base_job full
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 4
json.dump(c, open(sys.argv[1], "w"))' "$tmp/model.json"
rm -rf "$tmp/base"
"$fsdpctl" init --model-config "$tmp/model.json" --out "$tmp/base" --seed 5 > /dev/null

run() { # NAME overrides...: run_job with a checkpoint directory of its own, the final tensors kept
    local name=$1
    shift
    run_job "$name" "final_params=$tmp/$name.safetensors" -- --checkpoint.dir="$tmp/ck-$name" \
        --fsdp.activation_checkpointing=full "$@"
    must_succeed "$name"
}
same_bits() { # A B: the same losses and the same final tensors, bit for bit
    join "$tmp/$1.loss" "$tmp/$2.loss" > "$tmp/joined"
    [ "$(wc -l < "$tmp/joined")" -ge 6 ] || fail "too few common steps in $1 and $2"
    awk '$2 != $3 { bad = 1; print } END { exit bad }' "$tmp/joined" || fail "losses of $1 and $2 differ"
    cmp "$tmp/$1.safetensors" "$tmp/$2.safetensors" || fail "$1 and $2 trained other tensors"
}
mem_bytes() { sed -n '1s/.*"mem_bytes":\([0-9]*\).*/\1/p' "$tmp/$1.jsonl"; }
# plan_field OVERRIDES... : the plan's JSON (fsdp bytes a worker, offloaded layers, host bytes)
plan_json() {
    "$fsdpctl" plan "$tmp/job.json" --fsdp.activation_checkpointing=full --json "$@" > "$tmp/plan.json" ||
        { cat "$tmp/plan.json"; fail "plan $* failed"; }
    python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); o = p["offload_activations"]
print(p["gpu_memory"]["fsdp"], o["layers"], o["host_bytes"])' "$tmp/plan.json"
}

type=full
run $type --train.type=$type
read -r total none _ <<< "$(plan_json --train.type=$type --fsdp.offload_activations=true)"
[ "$none" -eq 0 ] || fail "$type: with no limit the plan offloads $none layer inputs"
# one byte short: one layer input goes; then all that may go (3 of 4: the last stays)
read -r _ one input <<< "$(plan_json --train.type=$type --fsdp.offload_activations=true \
    --runtime.gpu_memory_limit=$((total - 1)))"
[ "$one" -eq 1 ] || fail "$type: one byte short, the plan offloads $one layer inputs"
limit=$((total - 2 * input - 1))
read -r planned three _ <<< "$(plan_json --train.type=$type --fsdp.offload_activations=true \
    --runtime.gpu_memory_limit=$limit)"
[ "$three" -eq 3 ] || fail "$type: the plan offloads $three layer inputs, not 3"
"$fsdpctl" plan "$tmp/job.json" --fsdp.activation_checkpointing=full --train.type=$type \
    --fsdp.offload_activations=true --runtime.gpu_memory_limit=$limit > "$tmp/plan.txt"
grep -q "fsdp.offload_activations: 3 of 4 layer inputs in host memory" "$tmp/plan.txt" ||
    { cat "$tmp/plan.txt"; fail "$type: the plan does not show the offloaded inputs"; }
run ${type}_acts --train.type=$type --fsdp.offload_activations=true --runtime.gpu_memory_limit=$limit
grep -q "fsdp.offload_activations: 3 of 4 layer inputs in host memory" "$tmp/${type}_acts.log" ||
    { cat "$tmp/${type}_acts.log"; fail "$type: the worker did not offload 3 layer inputs"; }
same_bits $type ${type}_acts
a=$(mem_bytes $type) b=$(mem_bytes ${type}_acts)
[ $((a - b)) -eq $((3 * input)) ] || fail "$type: context memory $a without, $b with: not 3 x $input less"
[ "$b" -le "$planned" ] || fail "$type: the worker holds $b bytes, the plan says $planned"
echo "$type: 3 of 4 layer inputs offloaded, the same bits, context memory $a -> $b bytes"

# fsdp_qlora's flag (no limit: nothing must go, nothing goes); refused without full recompute
run lora --train.type=lora
run flag --train.type=lora --use_activation_cpu_offload=true
grep -q "fsdp.offload_activations: 0 of 4 layer inputs in host memory" "$tmp/flag.log" ||
    { cat "$tmp/flag.log"; fail "--use_activation_cpu_offload did not set fsdp.offload_activations"; }
same_bits lora flag
expect_status 2 "fsdp.offload_activations: moves the layer inputs that full recompute keeps" \
    "$fsdpd" --job "$tmp/job.json" --fsdp.offload_activations=true --fsdp.activation_checkpointing=selective

run chunked --train.type=full --fsdp.mlp_chunk=7 --fsdp.offload_activations=true --runtime.gpu_memory_limit=$limit
join "$tmp/full.loss" "$tmp/chunked.loss" > "$tmp/joined"
[ "$(wc -l < "$tmp/joined")" -ge 6 ] || fail "too few common steps in full and chunked"
awk 'NR == 1 && $2 != $3 { exit 1 } { d = $2 - $3; if (d < 0) d = -d; if (d > 1e-5 * $2) exit 1 }' "$tmp/joined" ||
    { cat "$tmp/joined"; fail "fsdp.mlp_chunk changed the losses beyond fp32 rounding"; }
read -r planned_chunked _ <<< "$(plan_json --train.type=full --fsdp.mlp_chunk=7 --fsdp.offload_activations=true \
    --runtime.gpu_memory_limit=$limit)"
c=$(mem_bytes chunked)
[ "$c" -lt "$b" ] && [ "$c" -le "$planned_chunked" ] && [ "$planned_chunked" -lt "$planned" ] ||
    fail "mlp_chunk: context memory $c (offloaded only: $b), planned $planned_chunked (offloaded only: $planned)"
echo "mlp_chunk 7: the losses within fp32 rounding, context memory $b -> $c bytes"
echo "offload_activations: ok"
