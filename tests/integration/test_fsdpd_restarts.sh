#!/usr/bin/env bash
# What fsdpd restarts (F17): a worker that stops heartbeating while alive (SIGSTOP) is
# declared dead, killed after the failure's grace although it is seen again at every
# heartbeat check (heartbeat_s 1), and the job restarts from `latest` (max_restarts 1) and
# completes.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# --- a stalled worker: declared dead, killed, the job restarts and completes ----------------
"$fsdpd" --job "$tmp/job.json" --train.max_steps=1500 --checkpoint.interval_steps=100 \
    --checkpoint.dir="$tmp/stall-ckpt" --runtime.max_restarts=1 > "$tmp/stall.log" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_for 30 sh -c "ls '$tmp/stall-ckpt' 2>/dev/null | grep -q '^step-[0-9]*$'"
victim=$(worker_pids "$tmp/stall.log" | tail -1)
kill -STOP "$victim"
bg_pids+=("$victim")
# Declared dead after max(3 x 1 s, 1 s + 10 s) = 11 s, killed 2 s later, then the restart.
wait_for 45 sh -c "! kill -0 $pid 2>/dev/null"
status=0
wait "$pid" || status=$?
[ "$status" -eq 0 ] || { cat "$tmp/stall.log"; fail "the job with a stalled worker exited $status"; }
grep -q "restart 1 of 1 after: rank 1 sent nothing for" "$tmp/stall.log" || { cat "$tmp/stall.log"; fail "no restart after the missed heartbeats"; }
grep -q "step 1500/1500" "$tmp/stall.log" || fail "the restarted job did not complete"
assert_gone "$victim"

echo ok
