#!/usr/bin/env bash
# FSDP on the CPU backend (F5): one 12-sequence global batch with variable masks, run with
# 1, 2, 3 and 4 workers and 1 or 2 micro-batches per rank (flat sizes that divide by neither
# 3 nor 4), gives the same loss at every step and the same final parameters (relative
# difference <= 1e-5); no_shard agrees too; activation checkpointing (full, selective, auto)
# gives the same bits and recomputes what it says; tied embeddings train; an injected NaN stops the
# job naming the step and the rank.  Overlap off gives the same bits; save_final=false
# writes no checkpoint.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# run NAME WORKERS MICRO [overrides...]: trains, keeps the losses and the final parameters.
run() {
    local name=$1 workers=$2 micro=$3
    shift 3
    FSDP_FAULTS=final_params="$tmp/$name.safetensors" "$fsdpd" --job "$tmp/job.json" \
        --runtime.workers_per_node="$workers" --train.micro_batch="$micro" \
        --runtime.metrics="$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 \
        || { cat "$tmp/$name.log"; fail "run $name failed"; }
    sed -n 's/.*"loss": *\([-0-9.e+]*\).*/\1/p' "$tmp/$name.jsonl" > "$tmp/$name.loss"
    [ "$(wc -l < "$tmp/$name.loss")" -eq 4 ] || fail "run $name: expected 4 losses"
}

# same_losses A B: losses at every step agree to 1e-5 relative.
same_losses() {
    paste "$tmp/$1.loss" "$tmp/$2.loss" | awk -v a="$1" -v b="$2" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($2 < 0 ? -$2 : $2)) { bad = 1;
          printf "step %d: %s %s vs %s %s\n", NR, a, $1, b, $2 } }
        END { exit bad }' || fail "losses of $1 and $2 differ"
}
same_params() {
    "$fsdpctl" compare "$tmp/$1.safetensors" "$tmp/$2.safetensors" --rtol "${3:-1e-5}" > "$tmp/cmp.txt" \
        || { cat "$tmp/cmp.txt"; fail "final parameters of $1 and $2 differ"; }
}

run w1m1 1 12
run w1m2 1 6
run w2m1 2 6
run w2m2 2 3
run w3m1 3 4
run w3m2 3 2
run w4m1 4 3
for r in w1m2 w2m1 w2m2 w3m1 w3m2 w4m1; do
    same_losses w1m1 "$r"
    same_params w1m1 "$r"
done
echo "losses: $(tr '\n' ' ' < "$tmp/w1m1.loss")"
# Each step reports rank 0's context memory; sharded over 2 ranks (half the micro-batch too)
# it holds less than alone.
mem() { tail -1 "$tmp/$1.jsonl" | sed -n "s/.*\"$2\": *\([0-9]*\).*/\1/p"; }
[ "$(mem w1m1 mem_bytes)" -gt 0 ] && [ "$(mem w1m1 mem_peak_bytes)" -ge "$(mem w1m1 mem_bytes)" ] ||
    fail "w1m1: memory $(mem w1m1 mem_bytes), peak $(mem w1m1 mem_peak_bytes)"
[ "$(mem w2m1 mem_bytes)" -lt "$(mem w1m1 mem_bytes)" ] ||
    fail "2 ranks hold $(mem w2m1 mem_bytes) bytes each, 1 rank $(mem w1m1 mem_bytes)"
awk 'NR == 1 { first = $1 } END { if (!($1 < first)) exit 1 }' "$tmp/w1m1.loss" || fail "the loss did not fall"

# Overlap off (every collective finished before the compute after it is queued) computes
# the same bits as on: only the order of queueing changes.
run w3m2_sync 3 2 --fsdp.forward_prefetch=false --fsdp.backward_prefetch=false
cmp "$tmp/w3m2.safetensors" "$tmp/w3m2_sync.safetensors" || fail "overlap off changed the parameters"
cmp "$tmp/w3m2.loss" "$tmp/w3m2_sync.loss" || fail "overlap off changed the losses"

# checkpoint.save_final=false: no checkpoint at the end (nothing to consolidate either).
run nosave 2 6 --checkpoint.save_final=false --output.consolidate=false --checkpoint.dir="$tmp/nosave-ckpt"
# (the lock file, emptied at the end, is the job's claim on the directory, no checkpoint)
[ -z "$(ls "$tmp/nosave-ckpt" 2>/dev/null | grep -vx fsdpd.lock)" ] || fail "save_final=false still wrote $(ls "$tmp/nosave-ckpt")"

# no_shard (DDP) is the same computation with replicated parameters.
run ns3 3 2 --fsdp.sharding=no_shard
same_losses w1m1 ns3
same_params w1m1 ns3

# Activation checkpointing (full, selective, auto): same result; full and selective recompute
# every layer but the last (whose activations are still in place), auto keeps everything
# without a limit on the CPU backend and recomputes as full when only full fits the limit.
run ac2 2 3 --fsdp.activation_checkpointing=full
run sel2 2 3 --fsdp.activation_checkpointing=selective
run auto2 2 3 --fsdp.activation_checkpointing=auto
grep -q "fsdp.activation_checkpointing auto: none: every layer keeps its activations" "$tmp/auto2.log" ||
    { cat "$tmp/auto2.log"; fail "auto without a limit did not keep everything"; }
# what full needs: a limit of 1 byte leaves auto full, and the refusal says the need
"$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=2 --train.micro_batch=3 \
    --fsdp.activation_checkpointing=auto --runtime.gpu_memory_limit=1 > "$tmp/need.log" 2>&1 &&
    fail "a 1-byte limit trained"
need=$(sed -n 's/.*each worker needs [0-9.]* GiB (\([0-9]*\) bytes).*/\1/p' "$tmp/need.log" | head -1)
[ -n "$need" ] || { cat "$tmp/need.log"; fail "no need in the refusal"; }
run autofull2 2 3 --fsdp.activation_checkpointing=auto --runtime.gpu_memory_limit="$need"
grep -q "fsdp.activation_checkpointing auto: full: every layer recomputed from its input" "$tmp/autofull2.log" ||
    { cat "$tmp/autofull2.log"; fail "auto at full's need did not recompute as full"; }
# a byte short of selective's need: auto keeps each layer's input, h and the attention's
# output (q, k, v and the MLP recomputed), and says so
"$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=2 --train.micro_batch=3 \
    --fsdp.activation_checkpointing=selective --runtime.gpu_memory_limit=1 > "$tmp/needsel.log" 2>&1 &&
    fail "a 1-byte limit trained"
needsel=$(sed -n 's/.*each worker needs [0-9.]* GiB (\([0-9]*\) bytes).*/\1/p' "$tmp/needsel.log" | head -1)
[ -n "$needsel" ] || { cat "$tmp/needsel.log"; fail "no need in selective's refusal"; }
run autoctx2 2 3 --fsdp.activation_checkpointing=auto --runtime.gpu_memory_limit=$((needsel - 1))
grep -q "fsdp.activation_checkpointing auto: every layer keeps its input, h and the attention's output" "$tmp/autoctx2.log" ||
    { cat "$tmp/autoctx2.log"; fail "auto a byte short of selective did not keep the attention's output"; }
for r in ac2 sel2 auto2 autofull2 autoctx2; do
    same_losses w2m2 "$r"
    cmp "$tmp/w2m2.safetensors" "$tmp/$r.safetensors" || fail "$r changed the parameters' bits"
done
fwd() { tail -1 "$tmp/$1.jsonl" | sed -n 's/.*"layer_forwards": *\([0-9]*\).*/\1/p'; }
# 2 layers x 2 micro-batches x 4 steps = 16 forwards without, and 8 recomputations of the
# first layer with full, selective (its MLP), auto at full's need and a byte short of selective's.
for r in w2m2:16 auto2:16 ac2:24 sel2:24 autofull2:24 autoctx2:24; do
    [ "$(fwd "${r%:*}")" -eq "${r#*:}" ] || fail "${r%:*}: expected ${r#*:} layer forwards, got $(fwd "${r%:*}")"
done

# Tied embeddings: 1 and 3 workers agree.
make_small_model "$tmp/tied" true
run t1 1 12 --model.config="$tmp/tied/model.json"
run t3 3 2 --model.config="$tmp/tied/model.json"
same_losses t1 t3
same_params t1 t3
run t3_sync 3 2 --model.config="$tmp/tied/model.json" --fsdp.forward_prefetch=false --fsdp.backward_prefetch=false
cmp "$tmp/t3.safetensors" "$tmp/t3_sync.safetensors" || fail "overlap off changed the tied model's parameters"

# An injected NaN stops the job, naming the step and the rank.
status=0
FSDP_FAULTS=nan_loss=1:3 "$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=3 \
    --train.micro_batch=2 > "$tmp/nan.log" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "the NaN run exited 0"
grep -q "step 3: non-finite loss on rank 1" "$tmp/nan.log" || { cat "$tmp/nan.log"; fail "NaN not reported"; }
echo "ok"
