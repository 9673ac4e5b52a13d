#!/usr/bin/env bash
# What fsdpd restarts and what it does not (F17):
# - a worker that stops heartbeating while alive (SIGSTOP) is declared dead, killed after the
#   failure's grace although it is seen again at every heartbeat check (heartbeat_s 1), and the
#   job restarts from `latest` (max_restarts 1) and completes;
# - an error no restart can cure fails at once, named, although max_restarts allows more: a
#   corrupt checkpoint section (found by the workers), a truncated checkpoint file (found by
#   fsdpd before any worker starts), a missing data file.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# expect_no_restart NAME NEEDLE OVERRIDES...: fsdpd fails with max_restarts 2, naming NEEDLE,
# and restarts nothing.
expect_no_restart() {
    local name=$1 needle=$2
    shift 2
    expect_error 1 "$needle" "$fsdpd" --job "$tmp/job.json" --runtime.max_restarts=2 "$@"
    grep -q "not restarted: a restart cannot cure this" "$tmp/cmd.err" || { cat "$tmp/cmd.err"; fail "$name: not called permanent"; }
    ! grep -q "restart [0-9]* of" "$tmp/cmd.err" || { cat "$tmp/cmd.err"; fail "$name: restarted"; }
}

# trained DIR: a checkpoint directory of the 4-step job.
trained() {
    "$fsdpd" --job "$tmp/job.json" --checkpoint.dir="$1" > "$1.log" 2>&1 || { cat "$1.log"; fail "the job to resume from failed"; }
}

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

# --- a corrupt section in the checkpoint to resume (the CRC check of the worker finds it) ----
trained "$tmp/c1"
shard="$tmp/c1/step-000004/rank-00001-of-00002.bin"
size=$(stat -c %s "$shard")
printf '\xff\xff\xff\xff' | dd of="$shard" bs=1 seek=$((size - 64)) conv=notrunc status=none
expect_no_restart crc "rank 1 failed" --checkpoint.dir="$tmp/c1" --checkpoint.resume=latest --train.max_steps=8
grep -q "rank-00001-of-00002.bin" "$tmp/cmd.err" || { cat "$tmp/cmd.err"; fail "the corrupt file is not named"; }

# --- a truncated checkpoint file (fsdpd's own check, before any worker starts) --------------
trained "$tmp/c2"
truncate -s 100 "$tmp/c2/step-000004/rank-00000-of-00002.bin"
expect_no_restart truncated "rank-00000-of-00002.bin" --checkpoint.dir="$tmp/c2" --checkpoint.resume=latest --train.max_steps=8

# --- a broken token cache (the workers' data loader) ------------------------------------------
# (a missing data file is fsdpd's own refusal now, before any worker: data_check)
printf 'FSDPTOK1' > "$tmp/short.tokens"
expect_no_restart short "short.tokens" --data.path="$tmp/short.tokens" --checkpoint.dir="$tmp/c3"
expect_error 2 "data.path: $tmp/missing.tokens: open: No such file or directory" \
    "$fsdpd" --job "$tmp/job.json" --runtime.max_restarts=2 --data.path="$tmp/missing.tokens" --checkpoint.dir="$tmp/c4"
echo ok
