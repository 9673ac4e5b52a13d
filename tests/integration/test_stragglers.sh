#!/usr/bin/env bash
# Stragglers named (F48): a rank whose own time a step (its step less its time in collectives)
# stays above runtime.straggler_factor x the ranks' median for runtime.straggler_steps steps
# is named in the log and in the status, with its phase:
# - one node of 3 ranks, rank 1 slower by 0.25 s a step (fault step_delay): named, phase
#   compute, by the log and by `fsdpctl status` while it trains; the other ranks are not;
# - the same delay on every rank: nobody is named (the watch compares the ranks);
# - a rank dying after the straggler was named: the failure's log names the straggler;
# - runtime.straggler_factor 0: the watch is off;
# - two nodes of one rank (netns hosts), the slow rank on node 1: the leader names it from its
#   node's heartbeats (the rank rows' timing, through the strict decoder).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--train.micro_batch=1 --train.max_steps=24 --checkpoint.save_final=false --output.consolidate=false
        --runtime.straggler_steps=4)

# run NAME FAULTS ARGS...: one node of 3 ranks, in the background (its pid in $pid)
run() {
    local name=$1 faults=$2
    shift 2
    FSDP_FAULTS="$faults" "$fsdpd" --job "$tmp/job.json" "${common[@]}" --runtime.workers_per_node=3 \
        --checkpoint.dir="$tmp/$name.ckpt" --output.dir="$tmp/$name.out" --runtime.metrics="$tmp/$name.jsonl" \
        --runtime.status_socket="$tmp/$name.sock" "$@" > "$tmp/$name.log" 2>&1 &
    pid=$!
    bg_pids+=("$pid")
}
finish() { wait "$pid" || { cat "$tmp/$1.log"; fail "$1: fsdpd failed"; }; }
named() { grep -q "is a straggler" "$tmp/$1.log"; }

# --- one slow rank -------------------------------------------------------------------------------
run slow "step_delay=1:0.25"
wait_for 60 named slow
"$fsdpctl" status --json --socket "$tmp/slow.sock" > "$tmp/slow.status" || fail "slow: status failed"
"$fsdpctl" status --socket "$tmp/slow.sock" > "$tmp/slow.status.txt" || fail "slow: status (text) failed"
finish slow
grep -q "rank 1 on node 0 is a straggler: 0\.[0-9]* s a step of its own (compute 0\.[0-9]* s, data 0\.[0-9]* s) against the other ranks' median 0\.[0-9]* s, 0\.[0-9]* s a step in all, for [0-9]* steps (runtime.straggler_factor 1.5): phase compute" "$tmp/slow.log" ||
    { grep straggler "$tmp/slow.log"; fail "slow: rank 1 not named as a compute straggler"; }
! grep "is a straggler" "$tmp/slow.log" | grep -v "rank 1 on node 0" || fail "slow: another rank was named"
python3 - "$tmp/slow.status" <<'PY' || fail "slow: the status does not list rank 1 as a straggler"
import json, sys
s = json.load(open(sys.argv[1]))["stragglers"]
assert len(s) == 1 and s[0]["rank"] == 1 and s[0]["node"] == 0 and s[0]["phase"] == "compute", s
assert s[0]["own_s"] > 0.2 and s[0]["median_own_s"] < 0.1 and s[0]["steps"] >= 4, s
PY
grep -q "straggler: rank 1 on node 0, phase compute" "$tmp/slow.status.txt" || { cat "$tmp/slow.status.txt"; fail "slow: fsdpctl status does not print the straggler"; }
echo "slow: rank 1 named a compute straggler, in the log and the status"

# --- a failure after a straggler was named: the failure's log names it too --------------------
run failed "step_delay=1:0.25;worker=2:exit:16"
status=0
wait "$pid" || status=$?
[ "$status" -ne 0 ] || fail "failed: the job with a dying rank exited 0"
grep -q "at the failure, rank 1 on node 0 was a straggler (phase compute" "$tmp/failed.log" ||
    { grep -i "straggler\|failed" "$tmp/failed.log"; fail "failed: the failure does not name the straggler"; }

# --- every rank as slow: nobody ------------------------------------------------------------------
run even "step_delay=0:0.25;step_delay=1:0.25;step_delay=2:0.25"
finish even
! grep -q "is a straggler" "$tmp/even.log" || { grep "is a straggler" "$tmp/even.log"; fail "even: a rank was named"; }

# --- the watch off ------------------------------------------------------------------------------
run off "step_delay=1:0.25" --runtime.straggler_factor=0
finish off
! grep -q "is a straggler" "$tmp/off.log" || fail "off: a rank was named with the watch off"
expect_error 2 "runtime.straggler_factor: 1 is not above 1" "$fsdpd" --job "$tmp/job.json" --runtime.straggler_factor=1
echo "even, off: nobody named"

# --- two nodes: the slow rank on node 1 ----------------------------------------------------------
if ! netns_available; then
    skip_test "two nodes: $NETNS_WHY"
fi
netns_up 2
pids=()
for i in 0 1; do
    netns_spawn "$i" "$tmp/two-n$i.log" env SLURM_JOB_ID=two SLURM_NNODES=2 SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-1]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x2)" FSDP_FAULTS="step_delay=1:0.25" \
        "$fsdpd" --job "$tmp/job.json" "${common[@]}" --runtime.workers_per_node=1 --runtime.join_timeout_s=20 \
        --checkpoint.dir="$tmp/two.ckpt" --output.dir="$tmp/two.out" --runtime.metrics="$tmp/two-n$i.jsonl" \
        --runtime.status_socket="$tmp/two-n$i.sock"
    pids+=("$NETNS_PID")
done
for i in 0 1; do wait "${pids[$i]}" || { tail -n 8 "$tmp/two-n$i.log"; fail "two: node $i failed"; }; done
grep -q "rank 1 on node 1 is a straggler: .*phase compute" "$tmp/two-n0.log" ||
    { grep -i "straggler\|refus\|protocol" "$tmp/two-n0.log"; fail "two: the leader did not name rank 1 on node 1"; }
! grep "is a straggler" "$tmp/two-n0.log" | grep -v "rank 1 on node 1" || fail "two: the waiting rank 0 was named"
echo "stragglers: ok"
