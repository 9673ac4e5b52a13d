#!/usr/bin/env bash
# fsdp.sharding=shard_grad_op (F33) on the CPU backend: a unit gathered in forward is kept
# until its backward, so the backward (and with activation checkpointing its recompute, and
# a tied head) reads the kept copy instead of re-gathering; the gradients are reduce-
# scattered as full_shard does.  The same bits as full_shard at the same world (losses and
# final parameters), and fewer all-gathers a step, counted (metrics' all_gathers, rank 0):
# with 2 layers and 2 micro-batches a rank, full_shard gathers 2 x (1 + 2 + 1 + 2) = 12
# units a step (14 with a tied head, which gathers the embedding again), shard_grad_op
# 2 x (1 + 2 + 1) = 8 (tied too): the layers' gathers halve.  hybrid_shard on one node is
# full_shard (tests/integration/test_multinode_hybrid.sh runs it across nodes).
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_model "$tmp/tied" true
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# run NAME [overrides...]: 2 workers, 2 micro-batches each; losses and final parameters kept.
run() {
    local name=$1
    shift
    FSDP_FAULTS=final_params="$tmp/$name.safetensors" "$fsdpd" --job "$tmp/job.json" \
        --runtime.metrics="$tmp/$name.jsonl" --checkpoint.dir="$tmp/ckpt-$name" "$@" \
        > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "run $name failed"; }
    sed -n 's/.*"loss": *\([-0-9.e+]*\).*/\1/p' "$tmp/$name.jsonl" > "$tmp/$name.loss"
    [ "$(wc -l < "$tmp/$name.loss")" -eq 4 ] || fail "run $name: expected 4 losses"
}
same_bits() {
    cmp "$tmp/$1.loss" "$tmp/$2.loss" || fail "losses of $1 and $2 differ"
    cmp "$tmp/$1.safetensors" "$tmp/$2.safetensors" || fail "final parameters of $1 and $2 differ"
}
# gathers NAME STEP: rank 0's all-gathers after STEP.
gathers() { sed -n "s/.*\"step\": *$2,.*\"all_gathers\": *\([0-9]*\).*/\1/p" "$tmp/$1.jsonl"; }
expect_gathers() { # NAME PER_STEP
    for s in 1 4; do
        [ "$(gathers "$1" $s)" = "$(($2 * s))" ] ||
            fail "$1: $(gathers "$1" $s) all-gathers after step $s, expected $(($2 * s))"
    done
}

run full
run grad_op --fsdp.sharding=shard_grad_op
same_bits full grad_op
expect_gathers full 12
expect_gathers grad_op 8

# Overlap off: the same bits, the same count.
run grad_op_sync --fsdp.sharding=shard_grad_op --fsdp.forward_prefetch=false --fsdp.backward_prefetch=false
same_bits full grad_op_sync
expect_gathers grad_op_sync 8

# Activation checkpointing: the recompute reads the kept copy (no gather) and gives the
# bits of full_shard's, which re-gathers.
run full_ac --fsdp.activation_checkpointing=full
run grad_op_ac --fsdp.sharding=shard_grad_op --fsdp.activation_checkpointing=full
same_bits full_ac grad_op_ac
expect_gathers full_ac 12
expect_gathers grad_op_ac 8

# A tied head reads the kept embedding.
run tied --model.config="$tmp/tied/model.json"
run tied_grad_op --model.config="$tmp/tied/model.json" --fsdp.sharding=shard_grad_op
same_bits tied tied_grad_op
expect_gathers tied 14
expect_gathers tied_grad_op 8

# 3 workers (units that do not divide by 3), 1 worker (nothing to gather).
run full3 --runtime.workers_per_node=3 --train.micro_batch=2
run grad_op3 --runtime.workers_per_node=3 --train.micro_batch=2 --fsdp.sharding=shard_grad_op
same_bits full3 grad_op3
run grad_op1 --runtime.workers_per_node=1 --train.micro_batch=6 --fsdp.sharding=shard_grad_op
run full1 --runtime.workers_per_node=1 --train.micro_batch=6
same_bits full1 grad_op1
expect_gathers grad_op1 0

# hybrid_shard on one node is full_shard (the node is the shard group, no replica).
run hybrid --fsdp.sharding=hybrid_shard
same_bits full hybrid
expect_gathers hybrid 12

# A shard_grad_op checkpoint is laid out as a full_shard one.
[ -f "$tmp/ckpt-grad_op/step-000004/manifest.json" ] || fail "no final checkpoint: $(ls -R "$tmp/ckpt-grad_op")"

# Not built: shard_grad_op with adapters or cpu_offload.
status=0
"$fsdpd" --job "$tmp/job.json" --fsdp.sharding=shard_grad_op --fsdp.cpu_offload=true > "$tmp/refused.log" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "shard_grad_op with cpu_offload ran"
grep -q "'shard_grad_op' with fsdp.cpu_offload is not built yet" "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "no refusal"; }
echo "ok"
