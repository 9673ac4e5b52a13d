#!/usr/bin/env bash
# schedule: alone
# Several nodes, part 2 (F21), in the namespace hosts of netns.sh with SLURM's variables:
# - checkpoints committed across 2 and 3 nodes (one manifest, every rank's file, `latest`),
#   consolidated once, by the leader; a 3-node checkpoint resumed on 2 nodes gives the bits
#   of the same checkpoint resumed on one node of 2 ranks; a save past its deadline on node 2
#   is abandoned, its writer told, and no partial directory stays;
# - status: the leader lists every node and rank, a follower itself and the leader;
#   `fsdpctl checkpoint` on a follower and SIGUSR1 to a follower's daemon checkpoint the whole
#   job (runtime.on_usr1=checkpoint: under SLURM SIGUSR1 means requeue by default); `fsdpctl
#   stop` on a follower stops every node after a committed checkpoint; SIGTERM to every
#   daemon (a preemption) commits one synchronous checkpoint of the job, then stops, and the
#   leader requeues the job (a stand-in scontrol: F22) and every node exits 0;
# - failures: a worker dying on node 2, node 2's daemon killed, node 2's daemon stopped
#   (SIGSTOP: its heartbeats stop), the leader killed.  Every time every node stops within
#   the limit naming the node (and rank), nothing is left running, and a relaunch
#   (SLURM_RESTART_COUNT=1) resumes from `latest` and ends with the bits of an uninterrupted
#   run.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"
netns_available || skip_test "$NETNS_WHY"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--runtime.join_timeout_s=20 --train.micro_batch=1 --train.max_steps=8 --checkpoint.interval_steps=2
        --checkpoint.keep=10 --runtime.workers_per_node=1 --output.consolidate=false)
STOP_LIMIT=20 # seconds from a failure until every daemon has exited
# The scontrol fsdpd runs to requeue its job after SIGTERM (daemon/requeue.h): the job is
# RUNNING, and the requeue is recorded.
mkdir -p "$tmp/bin"
cat > "$tmp/bin/scontrol" <<SH
#!/bin/sh
if [ "\$1" = show ]; then echo "JobId=\$4 JobState=RUNNING"; exit 0; fi
echo "\$*" >> "$tmp/scontrol.calls"
SH
chmod +x "$tmp/bin/scontrol"
export PATH="$tmp/bin:$PATH"

# node I of N of job JOB (checkpoints in $tmp/JOB.ckpt) in host I, in the background:
# NETNS_PID.  FAULTS is FSDP_FAULTS; RESTART is SLURM_RESTART_COUNT.
slurm_node() {
    local i=$1 n=$2 job=$3 restart=$4 faults=$5
    shift 5
    netns_spawn "$i" "$tmp/$job-r$restart-n$i.log" env SLURM_JOB_ID="$job" SLURM_NNODES="$n" SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-$((n - 1))]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x$n)" \
        SLURM_RESTART_COUNT="$restart" FSDP_FAULTS="$faults" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --checkpoint.dir="$tmp/$job.ckpt" --output.dir="$tmp/$job.out" \
        --runtime.metrics="$tmp/$job-r$restart-n$i.jsonl" --runtime.status_socket="$tmp/$job-n$i.sock" "$@"
}

# start_nodes N JOB RESTART FAULTS ARGS...: every node; their pids in NODE_PIDS.
start_nodes() {
    local n=$1 i
    NODE_PIDS=()
    for ((i = 0; i < n; i++)); do slurm_node "$i" "$@"; NODE_PIDS+=("$NETNS_PID"); done
}

# run_nodes N JOB RESTART FAULTS ARGS...: every node, all must succeed.
run_nodes() {
    local i
    start_nodes "$@"
    for i in "${!NODE_PIDS[@]}"; do
        wait "${NODE_PIDS[$i]}" || { tail -n 8 "$tmp/$2-r$3"-n*.log; fail "$2 (restart $3): node $i failed"; }
    done
}

# all_fail JOB RESTART: every node's daemon exits non-zero within STOP_LIMIT seconds.
all_fail() {
    local i status t0=$SECONDS
    for i in "${!NODE_PIDS[@]}"; do
        status=0
        wait_exit "${NODE_PIDS[$i]}" || status=$?
        [ "$status" -ne 0 ] || { tail -n 8 "$tmp/$1-r$2-n$i.log"; fail "$1: node $i exited 0 after the failure"; }
    done
    [ $((SECONDS - t0)) -le "$STOP_LIMIT" ] || fail "$1: the nodes took $((SECONDS - t0)) s to stop"
}

# wait_exit PID: its exit status, within STOP_LIMIT seconds (else the test fails).
wait_exit() {
    local pid=$1 i
    for ((i = 0; i < STOP_LIMIT * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null &&
        fail "process $pid still runs $STOP_LIMIT s after the failure"
    wait "$pid"
}

same_file() { cmp "$1" "$2" || fail "$3"; }

# the relaunch of JOB on N nodes: resumes from latest and ends with the reference's bits
relaunch_same_bits() {
    local n=$1 job=$2 from
    from=$(latest_step "$job")
    [ -n "$from" ] || fail "$job: no checkpoint committed before the failure"
    run_nodes "$n" "$job" 1 "final_params=$tmp/$job.final.safetensors" --checkpoint.resume=auto
    grep -q "resuming from $tmp/$job.ckpt/step-0*$from" "$tmp/$job-r1-n0.log" || { cat "$tmp/$job-r1-n0.log"; fail "$job: the relaunch did not resume from step $from"; }
    grep -q "resuming from $tmp/$job.ckpt/step-0*$from" "$tmp/$job-r1-n2.log" || fail "$job: node 2 did not resume from step $from"
    same_file "$tmp/ref3.safetensors" "$tmp/$job.final.safetensors" "$job: the relaunch's final parameters differ from an uninterrupted run's"
    echo "$job: resumed from step $from on every node: the same bits as an uninterrupted run"
}

netns_up 3

# --- references: one node ------------------------------------------------------------------
FSDP_FAULTS="final_params=$tmp/ref3.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
    --runtime.workers_per_node=3 --checkpoint.dir="$tmp/ref3.ckpt" --output.dir="$tmp/ref3.out" \
    > "$tmp/ref3.log" 2>&1 || { cat "$tmp/ref3.log"; fail "the one-node reference failed"; }

# --- a checkpoint across 2 nodes of 2 ranks: committed, consolidated by the leader ----------
run_nodes 2 c2 0 "final_params=$tmp/c2.final.safetensors" --runtime.workers_per_node=2 --output.consolidate=true \
    --checkpoint.async=false
python3 - "$tmp/c2.ckpt" <<'PY' || fail "c2: the committed checkpoints are not what 2 nodes of 2 ranks wrote"
import json, os, sys
d = sys.argv[1]
steps = sorted(x for x in os.listdir(d) if x.startswith("step-"))
assert [int(s[5:]) for s in steps] == [2, 4, 6, 8], steps
assert os.readlink(os.path.join(d, "latest")) == steps[-1]
for s in steps:
    m = json.load(open(os.path.join(d, s, "manifest.json")))
    assert m["world_size"] == 4, m["world_size"]
    files = sorted(f["rank"] for f in m["files"])
    assert files == [0, 1, 2, 3], files
    for f in m["files"]:
        assert os.path.getsize(os.path.join(d, s, f["name"])) == f["bytes"]
assert not [x for x in os.listdir(d) if ".partial" in x]
PY
[ -f "$tmp/c2.out/model.safetensors" ] || fail "c2: the leader did not consolidate"
grep -q "consolidated step 8" "$tmp/c2-r0-n0.log" || fail "c2: no consolidation logged by the leader"
! grep -q "consolidated" "$tmp/c2-r0-n1.log" || fail "c2: a follower consolidated too"
grep -q "checkpoint $tmp/c2.ckpt/step-0*8 committed: 4 files" "$tmp/c2-r0-n0.log" || fail "c2: the final commit was not logged"
echo "c2: 4 checkpoints committed across 2 nodes (4 files each), consolidated once by the leader"

# --- a checkpoint across 3 nodes, resumed on 2 ----------------------------------------------
run_nodes 3 c3 0 "" --train.max_steps=8 --checkpoint.interval_steps=4 --checkpoint.save_final=false
[ "$(latest_step c3)" = 8 ] || fail "c3: latest is not step 8"
step4=$tmp/c3.ckpt/step-000004
python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); assert m["world_size"] == 3 and len(m["files"]) == 3' \
    "$step4/manifest.json" || fail "c3: step 4 is not a checkpoint of 3 ranks"
mkdir -p "$tmp/c3on2.ckpt" "$tmp/c3on1.ckpt"
cp -a "$step4" "$tmp/c3on2.ckpt/"
cp -a "$step4" "$tmp/c3on1.ckpt/"
ln -s "$(basename "$step4")" "$tmp/c3on2.ckpt/latest"
ln -s "$(basename "$step4")" "$tmp/c3on1.ckpt/latest"
FSDP_FAULTS="final_params=$tmp/c3on1.final.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
    --runtime.workers_per_node=2 --checkpoint.dir="$tmp/c3on1.ckpt" --output.dir="$tmp/c3on1.out" \
    --checkpoint.resume=auto > "$tmp/c3on1.log" 2>&1 || { cat "$tmp/c3on1.log"; fail "c3: the one-node resume on 2 ranks failed"; }
run_nodes 2 c3on2 0 "final_params=$tmp/c3on2.final.safetensors" --checkpoint.resume=auto
grep -q "resuming from $tmp/c3on2.ckpt/step-000004: .*written by 3 ranks" "$tmp/c3on2-r0-n1.log" || fail "c3: node 1 did not resume the 3-rank checkpoint"
same_file "$tmp/c3on1.final.safetensors" "$tmp/c3on2.final.safetensors" "c3: resumed on 2 nodes, the bits differ from one node of 2 ranks"
echo "c3: a checkpoint of 3 nodes resumed on 2 nodes: the bits of one node of 2 ranks"

# --- a save past its deadline on node 2: abandoned on every node, nothing partial stays ------
run_nodes 3 cd 0 "step_delay=0:0.5;ckpt_write=2:stall:1" --checkpoint.timeout_s=2
grep -q "checkpoint of step 2 abandoned: rank 2 did not finish writing within checkpoint.timeout_s = 2 s" \
    "$tmp/cd-r0-n0.log" || { cat "$tmp/cd-r0-n0.log"; fail "cd: the leader did not abandon rank 2's late save"; }
[ "$(latest_step cd)" = 8 ] || fail "cd: latest is not the final step 8"
[ ! -e "$tmp/cd.ckpt/step-000002" ] || fail "cd: the abandoned save was committed"
[ -z "$(ls -d "$tmp"/cd.ckpt/*.partial* 2>/dev/null)" ] || fail "cd: a partial directory was left: $(ls "$tmp/cd.ckpt")"
echo "cd: a late save on node 2 abandoned by the leader, its writer told, nothing partial left; step 8 committed"

# --- status, and checkpoints and a stop asked of followers ----------------------------------
start_nodes 3 st 0 "step_delay=0:0.5" --checkpoint.interval_steps=0 --train.max_steps=20 --runtime.on_usr1=checkpoint
# every node training, as the leader heard from each (its heartbeats carry its ranks)
all_training() {
    "$fsdpctl" status --socket "$tmp/st-n0.sock" --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
sys.exit(0 if [n["state"] for n in r.get("nodes", [])] == ["training"] * 3 else 1)' 2>/dev/null
}
wait_for 30 all_training
"$fsdpctl" status --socket "$tmp/st-n0.sock" --json > "$tmp/st-leader.json" || fail "st: status on the leader failed"
"$fsdpctl" status --socket "$tmp/st-n1.sock" --json > "$tmp/st-follower.json" || fail "st: status on a follower failed"
python3 - "$tmp/st-leader.json" "$tmp/st-follower.json" "${NETNS_ADDRS[0]}" <<'PY' || fail "st: the status does not show the nodes"
import json, sys
lead, fol, addr0 = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
assert [n["node"] for n in lead["nodes"]] == [0, 1, 2], lead["nodes"]
assert sorted((r["rank"], r["node"]) for r in lead["ranks"]) == [(0, 0), (1, 1), (2, 2)], lead["ranks"]
assert all(r["running"] for r in lead["ranks"]), lead["ranks"]
assert [n["node"] for n in fol["nodes"]] == [0, 1], fol["nodes"]
assert fol["nodes"][0]["role"] == "leader" and fol["nodes"][0]["host"].startswith(addr0 + ":"), fol["nodes"][0]
assert [(r["rank"], r["node"]) for r in fol["ranks"]] == [(1, 1)], fol["ranks"]
PY
# a follower's status shows the job's step: the leader's, from its heartbeats (F39)
follower_step() { "$fsdpctl" status --socket "$tmp/st-n1.sock" 2>/dev/null | grep -q "^step [1-9][0-9]*/20 "; }
wait_for 20 follower_step
"$fsdpctl" status --socket "$tmp/st-n0.sock" | grep -q "node 2" || { "$fsdpctl" status --socket "$tmp/st-n0.sock"; fail "st: the leader's status text does not list node 2"; }
expect_status 0 "checkpoint requested from the leader" "$fsdpctl" checkpoint --socket "$tmp/st-n1.sock"
wait_for 20 has_latest st
first=$(latest_step st)
grep -q "checkpoint requested (status socket on node 1)" "$tmp/st-r0-n0.log" || fail "st: the leader did not log node 1's request"
kill -USR1 "${NODE_PIDS[2]}"
wait_for 20 sh -c "[ \"\$(readlink '$tmp/st.ckpt/latest')\" != \"\$(basename '$tmp'/st.ckpt/step-*$first)\" ]"
grep -q "checkpoint requested (SIGUSR1 on node 2)" "$tmp/st-r0-n0.log" || fail "st: the leader did not log node 2's SIGUSR1"
expect_status 0 "stopping: asked the leader" "$fsdpctl" stop --socket "$tmp/st-n2.sock"
for i in 0 1 2; do wait "${NODE_PIDS[$i]}" || { tail -n 5 "$tmp/st-r0-n$i.log"; fail "st: node $i did not stop cleanly after fsdpctl stop"; }; done
grep -q "committed: stopping" "$tmp/st-r0-n0.log" || fail "st: the stop did not wait for a commit"
[ "$(tail -n 1 "$tmp/st-r0-n0.jsonl" | sed -n 's/.*"step":\([0-9]*\).*/\1/p')" -lt 20 ] || fail "st: the job ran to its end"
nothing_left st
echo "st: status of every node; checkpoints from a follower's socket and SIGUSR1; a follower's stop stopped every node"

# --- SIGTERM to every daemon (a preemption): one synchronous checkpoint of the job, then a stop
start_nodes 3 tm 0 "step_delay=0:0.4"
wait_for 30 has_latest tm
kill -TERM "${NODE_PIDS[@]}"
for i in 0 1 2; do
    status=0
    wait_exit "${NODE_PIDS[$i]}" || status=$?
    [ "$status" -eq 0 ] || { tail -n 5 "$tmp/tm-r0-n$i.log"; fail "tm: node $i exited $status after SIGTERM, not 0 (requeued)"; }
    grep -q "stopped by signal SIGTERM" "$tmp/tm-r0-n$i.log" || fail "tm: node $i does not say SIGTERM stopped it"
done
[ "$(cat "$tmp/scontrol.calls")" = "requeue tm" ] || fail "tm: the job was not requeued once by the leader: $(cat "$tmp/scontrol.calls")"
grep -q "job tm requeued" "$tmp/tm-r0-n0.log" && grep -q "node 0 requeues the job" "$tmp/tm-r0-n1.log" ||
    { tail -n 3 "$tmp"/tm-r0-n*.log; fail "tm: the requeue is not logged"; }
grep -q "checkpoint of step [0-9]* committed: stopping" "$tmp/tm-r0-n0.log" || { cat "$tmp/tm-r0-n0.log"; fail "tm: no synchronous checkpoint before the stop"; }
[ "$(latest_step tm)" -lt 8 ] || fail "tm: the job ran to its end"
nothing_left tm
relaunch_same_bits 3 tm

# --- failures --------------------------------------------------------------------------------
slow="step_delay=0:0.4"

# a worker dies on node 2
start_nodes 3 fw 0 "$slow;worker=2:exit:5"
all_fail fw 0
grep -q "node 2 (${NETNS_ADDRS[2]}) failed: rank 2 exited with status" "$tmp/fw-r0-n0.log" || { cat "$tmp/fw-r0-n0.log"; fail "fw: the leader did not name node 2 and rank 2"; }
grep -q "stopped by the leader: node 2" "$tmp/fw-r0-n1.log" || fail "fw: node 1 was not stopped by the leader"
nothing_left fw
relaunch_same_bits 3 fw

# node 2's daemon is killed
start_nodes 3 fd 0 "$slow"
wait_for 30 has_latest fd
kill -KILL "${NODE_PIDS[2]}"
all_fail fd 0
grep -q "node 2 (${NETNS_ADDRS[2]}) closed its connection" "$tmp/fd-r0-n0.log" || { cat "$tmp/fd-r0-n0.log"; fail "fd: the leader did not name node 2"; }
nothing_left fd
relaunch_same_bits 3 fd

# node 2's daemon stops (SIGSTOP): its heartbeats stop
start_nodes 3 fs 0 "step_delay=0:1.5" --runtime.node_timeout_s=3 # slower: its workers train on without their daemon
wait_for 30 has_latest fs
kill -STOP "${NODE_PIDS[2]}"
stopped=${NODE_PIDS[2]}
NODE_PIDS=("${NODE_PIDS[0]}" "${NODE_PIDS[1]}")
all_fail fs 0
grep -q "node 2 (${NETNS_ADDRS[2]}) sent nothing for [0-9]* s (runtime.node_timeout_s = 3 s)" "$tmp/fs-r0-n0.log" ||
    { cat "$tmp/fs-r0-n0.log"; fail "fs: the leader did not name the silent node 2"; }
kill -CONT "$stopped"
NODE_PIDS=("$stopped")
all_fail fs 0
nothing_left fs
relaunch_same_bits 3 fs

# the leader is killed
start_nodes 3 fl 0 "$slow"
wait_for 30 has_latest fl
kill -KILL "${NODE_PIDS[0]}"
all_fail fl 0
for i in 1 2; do
    grep -q "the leader (node 0, ${NETNS_ADDRS[0]}:[0-9]*) closed its connection" "$tmp/fl-r0-n$i.log" ||
        { cat "$tmp/fl-r0-n$i.log"; fail "fl: node $i did not name the leader"; }
done
nothing_left fl
relaunch_same_bits 3 fl
[ -z "$(ls "$tmp"/fl.ckpt/fsdpd-rendezvous-* 2>/dev/null)" ] || fail "fl: the killed leader's rendezvous file is still there"
grep -q "removed $tmp/fl.ckpt/fsdpd-rendezvous-fl-r0-a0.json, left by an earlier run" "$tmp/fl-r1-n0.log" ||
    fail "fl: the relaunch did not remove the killed leader's rendezvous file"
echo "multinode_ckpt: ok"
