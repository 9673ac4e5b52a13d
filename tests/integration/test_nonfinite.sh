#!/usr/bin/env bash
# A non-finite gradient norm (one gradient element poisoned, the loss finite) stops the job:
# fsdpd exits non-zero naming the step, the rank and "gradient norm", before that step's
# update or checkpoint; the last good checkpoint stays `latest`.  (The non-finite loss is
# test_fsdp_equivalence.sh's.)
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

status=0
FSDP_FAULTS=nan_grad=1:3 "$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=3 \
    --train.micro_batch=2 --train.max_steps=6 --checkpoint.interval_steps=2 \
    --checkpoint.async=false --runtime.metrics="$tmp/m.jsonl" > "$tmp/nan.log" 2>&1 || status=$?
[ "$status" -ne 0 ] || { cat "$tmp/nan.log"; fail "the run with a NaN gradient exited 0"; }
grep -q "step 3: non-finite gradient norm on rank 1" "$tmp/nan.log" ||
    { cat "$tmp/nan.log"; fail "the NaN gradient is not reported with its step and rank"; }
grep -q "non-finite loss" "$tmp/nan.log" && fail "a poisoned gradient was reported as a loss"
# steps 1 and 2 ran and were checkpointed; step 3 was not applied
[ "$(sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$tmp/m.jsonl" | tr '\n' ' ')" = "1 2 " ] ||
    { cat "$tmp/m.jsonl"; fail "expected metrics for steps 1 and 2 only"; }
[ "$(readlink "$tmp/ckpt/latest")" = step-000002 ] || fail "latest is $(readlink "$tmp/ckpt/latest")"
[ ! -e "$tmp/ckpt/step-000003" ] || fail "step 3 was checkpointed"

# The same job without the hook runs through (the poison, not the job, stopped it).
"$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=3 --train.micro_batch=2 \
    --checkpoint.dir="$tmp/ck2" > "$tmp/ok.log" 2>&1 || { cat "$tmp/ok.log"; fail "the clean run failed"; }
echo "ok"
