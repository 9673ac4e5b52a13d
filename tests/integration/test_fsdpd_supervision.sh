#!/usr/bin/env bash
# fsdpd spawning and stopping its workers (F3): a job that succeeds (under SLURM on one node
# too); bad job files; SLURM environments that do not hold together, and what several nodes
# cannot do yet (checkpoints, F21); a worker
# that exits non-zero, one killed by SIGKILL, one that hangs when told to stop, one whose
# training stops moving while its heartbeats go on (runtime.stall_timeout_s): fsdpd exits
# non-zero within 10 s naming the cause and leaves no process behind; SIGKILL to fsdpd: its
# workers are gone within 5 s.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# --- a job that succeeds, with its metrics file --------------------------------------------
SLURM_JOB_ID=76 SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NODEID=0 SLURM_JOB_NODELIST=n0 "$fsdpd" \
    --job "$tmp/job.json" > "$tmp/ok.log" 2>&1 || { cat "$tmp/ok.log"; fail "the job failed"; }
grep -q "step 4/4" "$tmp/ok.log" || fail "no progress line for the last step"
[ "$(wc -l < "$tmp/out/metrics.jsonl")" -eq 4 ] || fail "metrics.jsonl should hold 4 lines"
grep -q '"loss"' "$tmp/out/metrics.jsonl" || fail "metrics lines carry no loss"
assert_gone $(worker_pids "$tmp/ok.log")

# --- bad job files: exit 2, the key named ----------------------------------------------------
echo '{"train": {"lr": "fast"}}' > "$tmp/bad1.json"
expect_status 2 "train.lr" "$fsdpd" --job "$tmp/bad1.json"
echo '{"trian": {}}' > "$tmp/bad2.json"
expect_status 2 "trian" "$fsdpd" --job "$tmp/bad2.json"
echo '{"model": {"init": "random"' > "$tmp/bad3.json"
expect_status 2 "bad3.json" "$fsdpd" --job "$tmp/bad3.json"
expect_status 2 "global_batch" "$fsdpd" --job "$tmp/job.json" --train.global_batch=7
expect_status 2 "not built yet" "$fsdpd" --job "$tmp/job.json" --fsdp.sharding=shard_grad_op --train.type=lora
expect_status 2 "usage" "$fsdpd"

# --- under SLURM on more than one node: refused, not one independent world a node ------------
expect_status 2 "SLURM_NNODES is set but SLURM_JOB_ID is not" env SLURM_NNODES=2 "$fsdpd" --job "$tmp/job.json"
slurm2=(SLURM_JOB_ID=77 SLURM_NODEID=0 SLURM_JOB_NODELIST="n[0-1]")
# (SLURM_JOB_NUM_NODES counts the nodes when SLURM_NNODES is unset)
expect_status 2 "runtime.spare_nodes: 2 spare(s) of 2 node(s) leave none to train" \
    env -u SLURM_NNODES "${slurm2[@]}" SLURM_JOB_NUM_NODES=2 "$fsdpd" --job "$tmp/job.json" --runtime.spare_nodes=2
expect_status 2 "SLURM_NNODES 'two' is not an integer >= 1" env "${slurm2[@]}" SLURM_NNODES=two "$fsdpd" --job "$tmp/job.json"
expect_status 2 "SLURM_JOB_NODELIST names 2 hosts but SLURM_NNODES is 3" env "${slurm2[@]}" SLURM_NNODES=3 "$fsdpd" --job "$tmp/job.json"

# --- a worker's own error reaches fsdpd's message ------------------------------------------
printf 'FSDPTOK1' > "$tmp/short.tokens" # a cache by its magic, too short: the worker's loader fails
expect_status 1 "rank 0 failed" "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/short.tokens"
grep -q "short.tokens" "$tmp/cmd.out" || fail "the worker's error does not name the broken file"

# run_timed NAME ENV...: runs the job in the background with the given environment, returns
# once fsdpd has exited (or fails after 10 s); sets $status and $elapsed.
run_timed() {
    local name=$1
    shift
    local start=$(date +%s%N)
    env "$@" "$fsdpd" --job "$tmp/job.json" --train.max_steps=1000 > "$tmp/$name.log" 2>&1 &
    local pid=$!
    bg_pids+=("$pid")
    wait_for 10 sh -c "! kill -0 $pid 2>/dev/null"
    status=0
    wait "$pid" || status=$?
    elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
}

# --- a worker that exits non-zero ------------------------------------------------------------
run_timed exit FSDP_FAULTS=worker=1:exit:2
[ "$status" -ne 0 ] || fail "fsdpd exited 0 after a worker failed"
grep -q "rank 1 exited with status 3" "$tmp/exit.log" || { cat "$tmp/exit.log"; fail "no reason given"; }
assert_gone $(worker_pids "$tmp/exit.log")
echo "worker exit: fsdpd stopped in ${elapsed} ms"

# --- a worker that hangs when told to stop: killed after the grace (at most 2 s after a failure)
run_timed hang "FSDP_FAULTS=worker=0:exit:2;worker=1:hang_on_stop"
[ "$status" -ne 0 ] || fail "fsdpd exited 0"
grep -q "rank 0 exited with status 3" "$tmp/hang.log" || { cat "$tmp/hang.log"; fail "wrong reason"; }
grep -q "killing them" "$tmp/hang.log" || { cat "$tmp/hang.log"; fail "the hung worker was not killed"; }
assert_gone $(worker_pids "$tmp/hang.log")
echo "hung worker: fsdpd stopped in ${elapsed} ms"

# --- a lone worker whose training stops moving (a GPU kernel that never ends: no collective
# times out on one GPU), its heartbeats still coming: the stall watch stops the job ----------
stall=(--runtime.workers_per_node=1 --runtime.heartbeat_s=1 --runtime.comm_timeout_s=1
       --checkpoint.timeout_s=1 --runtime.stall_timeout_s=4 --train.max_steps=1000)
start=$(date +%s)
FSDP_FAULTS=worker=0:hang:2 "$fsdpd" --job "$tmp/job.json" "${stall[@]}" > "$tmp/stall.log" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_for 20 sh -c "! kill -0 $pid 2>/dev/null"
status=0
wait "$pid" || status=$?
[ "$status" -ne 0 ] || { cat "$tmp/stall.log"; fail "fsdpd exited 0 after a stalled step"; }
grep -q "rank 0 made no progress for [4-9] s after step 2 (runtime.stall_timeout_s 4 s)" "$tmp/stall.log" ||
    { cat "$tmp/stall.log"; fail "the stall was not named"; }
assert_gone $(worker_pids "$tmp/stall.log")
echo "stalled worker: fsdpd stopped $(( $(date +%s) - start )) s after the start"
# a job that only runs slowly is not stalled: steps of 1.5 s under a 4 s watch
FSDP_FAULTS=step_delay=0:1.5 "$fsdpd" --job "$tmp/job.json" "${stall[@]}" --train.max_steps=5 > "$tmp/slow.log" 2>&1 ||
    { cat "$tmp/slow.log"; fail "a slow job was stopped"; }
expect_status 2 "runtime.stall_timeout_s: 4 s is not longer than a healthy step may wait" \
    "$fsdpd" --job "$tmp/job.json" "${stall[@]}" --runtime.comm_timeout_s=5

# --- a worker killed by SIGKILL ------------------------------------------------------------
env "$fsdpd" --job "$tmp/job.json" --train.max_steps=1000 > "$tmp/kill.log" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_for 10 grep -qs "step 2/" "$tmp/kill.log"
victim=$(worker_pids "$tmp/kill.log" | tail -1)
kill -9 "$victim"
wait_for 10 sh -c "! kill -0 $pid 2>/dev/null"
status=0
wait "$pid" || status=$?
[ "$status" -ne 0 ] || fail "fsdpd exited 0 after a worker was killed"
grep -q "killed by signal 9" "$tmp/kill.log" || { cat "$tmp/kill.log"; fail "no reason given"; }
assert_gone $(worker_pids "$tmp/kill.log")

# --- SIGKILL to fsdpd: every worker dies with it ----------------------------------------------
"$fsdpd" --job "$tmp/job.json" --train.max_steps=1000 > "$tmp/daemon.log" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_for 10 grep -qs "step 1/" "$tmp/daemon.log"
pids=$(worker_pids "$tmp/daemon.log")
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
gone() { for p in $pids; do kill -0 "$p" 2>/dev/null && return 1; done; return 0; }
wait_for 5 gone
echo "ok"
