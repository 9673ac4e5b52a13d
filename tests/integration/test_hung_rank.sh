#!/usr/bin/env bash
# The hung-rank locator (F23): one rank stalls before a collective while its heartbeats go
# on (fault comm_stall; a stopped process would be caught by the heartbeat path instead);
# the others time out in it, and fsdpd names the rank, its node and the collective it never
# started.
source "$(dirname "$0")/lib.sh"
make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
status=0
FSDP_FAULTS="comm_stall=1:20:30" "$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=3 \
    --runtime.comm_timeout_s=4 --train.micro_batch=1 --checkpoint.save_final=false \
    --output.consolidate=false > "$tmp/run.log" 2>&1 || status=$?
[ "$status" -eq 1 ] || { cat "$tmp/run.log"; fail "fsdpd exited $status, not 1, after a hung collective"; }
grep -Eq "hung-rank locator: rank 1 on node 0 never started [a-z_]+ #20( of unit [0-9]+)?; its last was [a-z_]+ #19" \
    "$tmp/run.log" || { cat "$tmp/run.log"; fail "the locator did not name rank 1 and collective #20"; }
[ "$(grep -c "hung-rank locator" "$tmp/run.log")" -eq 1 ] || fail "the locator blamed more than rank 1"
grep "hung-rank locator" "$tmp/run.log"
