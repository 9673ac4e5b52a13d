#!/usr/bin/env bash
# schedule: alone
# Restarts across nodes inside one launch (F48), 3 nodes of 1 rank in the namespace hosts of
# netns.sh with SLURM's variables, runtime.max_restarts > 0:
# - a worker on node 2 killed (-9), then a worker on node 1 killed while the restarted run sets
#   up (a second failure during the recovery): every node restarts its workers twice, from
#   `latest`, and the job ends with the bits of an uninterrupted run, every node exiting 0;
# - node 2's daemon killed, runtime.allow_shrink=false: no restart, the leader names the node
#   and the setting, and node 1 stops at once with the leader's reason (the next attempt's
#   rendezvous file says the launch ended);
# - a failure no restart cures on node 2 (its shard of the checkpoint to resume is corrupt):
#   every node fails at once, none restarts;
# - node 2's daemon killed, allow_shrink=true: the leader and node 1 go on as 2 nodes (the
#   global batch kept, accumulation 4 -> 6) from `latest` and end with the bits of that
#   checkpoint resumed on one node of 2 ranks;
# - node 2 stopped (SIGSTOP, its daemon and worker), allow_shrink=true: the leader finds it
#   silent (runtime.node_timeout_s) and goes on without it; once node 2 runs again it stops,
#   naming the lost leader, and nothing is left running;
# - a spare (runtime.spare_nodes=1, node 2): joined and idle through a run (a SIGTERM of its
#   own ignored: it follows the leader), which has the bits of 2 ranks; and, node 1's daemon killed, it takes node 1's place (the same ranks) and the
#   job ends with the bits of an uninterrupted run.
# In-memory checkpoints (on with max_restarts or spares): the two restarts of the first case
# resume from memory on every node, and so does the spare in node 1's place (the nodes copy
# their images to the spares: daemon/replica.h); a smaller world from disk.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"
netns_available || skip_test "$NETNS_WHY"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--runtime.join_timeout_s=20 --train.micro_batch=1 --train.max_steps=8 --checkpoint.interval_steps=2
        --checkpoint.keep=10 --runtime.workers_per_node=1 --output.consolidate=false)
slow="step_delay=0:0.4" # a job slow enough to act on mid-training (the bits are unchanged)

# node I of 3 of job JOB in host I, in the background: NETNS_PID.
slurm_node() {
    local i=$1 job=$2
    shift 2
    netns_spawn "$i" "$tmp/$job-n$i.log" env SLURM_JOB_ID="$job" SLURM_NNODES=3 SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-2]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x3)" \
        FSDP_FAULTS="${SLOW:-$slow};final_params=$tmp/$job.final.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --checkpoint.dir="$tmp/$job.ckpt" --output.dir="$tmp/$job.out" --runtime.metrics="$tmp/$job-n$i.jsonl" \
        --runtime.status_socket="$tmp/$job-n$i.sock" "$@"
}
start_nodes() { # JOB ARGS...: every node; their pids in NODE_PIDS
    local i
    NODE_PIDS=()
    for i in 0 1 2; do slurm_node "$i" "$@"; NODE_PIDS+=("$NETNS_PID"); done
}
# expect_exit JOB NODE WANT: node's daemon exits WANT (0, or "nonzero") within 60 s.
expect_exit() {
    local status=0
    wait_for 60 sh -c "! kill -0 ${NODE_PIDS[$2]} 2>/dev/null" || true
    wait "${NODE_PIDS[$2]}" || status=$?
    if [ "$3" = 0 ]; then
        [ "$status" -eq 0 ] || { tail -n 12 "$tmp/$1-n$2.log"; fail "$1: node $2 exited $status"; }
    else
        [ "$status" -ne 0 ] || { tail -n 12 "$tmp/$1-n$2.log"; fail "$1: node $2 exited 0"; }
    fi
}
# pid_of_rank LOG N: the pid of the N-th worker that node started (1: the first run's).
pid_of_rank() { worker_pids "$1" | sed -n "${2}p"; }
workers_started() { [ "$(worker_pids "$1" | wc -l)" -ge "$2" ]; } # LOG N
resumed_from() { # LOG: the step its last resume started from
    sed -n 's/.*resuming from .*step-0*\([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1
}

expect_error 2 "runtime.spare_nodes: 1 spare(s) of 1 node(s) leave none to train" "$fsdpd" --job "$tmp/job.json" \
    --runtime.spare_nodes=1
expect_error 2 "runtime.spare_nodes: 3 spare(s) of 3 node(s) leave none to train" env SLURM_JOB_ID=x SLURM_NNODES=3 \
    SLURM_NODEID=0 SLURM_JOB_NODELIST="n[0-2]" "$fsdpd" --job "$tmp/job.json" --runtime.spare_nodes=3

netns_up 3

# reference R: one node of R ranks, uninterrupted: its final parameters in $tmp/refR.safetensors
reference() {
    FSDP_FAULTS="final_params=$tmp/ref$1.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --runtime.workers_per_node="$1" --checkpoint.dir="$tmp/ref$1.ckpt" --output.dir="$tmp/ref$1.out" \
        > "$tmp/ref$1.log" 2>&1 || { cat "$tmp/ref$1.log"; fail "the one-node reference of $1 ranks failed"; }
}
reference 3

# --- a worker killed on node 2, then one on node 1 during the recovery: the same world, twice --
start_nodes rw --runtime.max_restarts=2
wait_for 30 has_latest rw
kill -KILL "$(pid_of_rank "$tmp/rw-n2.log" 1)"
wait_for 30 workers_started "$tmp/rw-n1.log" 2
kill -KILL "$(pid_of_rank "$tmp/rw-n1.log" 2)" # the restarted run's, before it trained
for i in 0 1 2; do expect_exit rw "$i" 0; done
# (a restart's reason is the first failure the leader hears of: the node's, or a rank's finding the dead peer;
# the node that lost its worker names it in its own log)
grep -q "rank 2 was killed by signal 9" "$tmp/rw-n2.log" &&
    grep -q "restart 1 of 2 after: " "$tmp/rw-n0.log" ||
    { cat "$tmp/rw-n0.log"; fail "rw: the leader did not restart after node 2's worker died"; }
grep -q "rank 1 was killed by signal 9" "$tmp/rw-n1.log" &&
    grep -q "restart 2 of 2 after: " "$tmp/rw-n0.log" ||
    { cat "$tmp/rw-n0.log"; fail "rw: the leader did not restart after node 1's worker died in the recovery"; }
for i in 1 2; do
    grep -q "restart 2 of 2 after: " "$tmp/rw-n$i.log" || { cat "$tmp/rw-n$i.log"; fail "rw: node $i did not restart twice"; }
done
[ "$(worker_pids "$tmp/rw-n2.log" | wc -l)" -eq 3 ] || fail "rw: node 2 did not start its worker three times"
# both restarts from the in-memory checkpoint (runtime.max_restarts turns it on), on every node
[ "$(grep -c "resuming from the in-memory checkpoint of step" "$tmp/rw-n0.log")" -eq 2 ] ||
    { cat "$tmp/rw-n0.log"; fail "rw: the leader did not resume twice from memory"; }
for i in 1 2; do
    [ "$(grep -c "resuming from .*/memory-manifest.json: step" "$tmp/rw-n$i.log")" -eq 2 ] ||
        { cat "$tmp/rw-n$i.log"; fail "rw: node $i did not resume twice from memory"; }
done
cmp "$tmp/ref3.safetensors" "$tmp/rw.final.safetensors" || fail "rw: the final parameters differ from an uninterrupted run's"
nothing_left rw
echo "rw: two failures, two restarts of every node, the bits of an uninterrupted run"

# --- node 2's daemon killed, no shrinking allowed: no restart -----------------------------------
start_nodes nd --runtime.max_restarts=2
wait_for 30 has_latest nd
kill -KILL "${NODE_PIDS[2]}"
expect_exit nd 0 nonzero
expect_exit nd 1 nonzero
grep -q "not restarted: node(s) 2 gone, and runtime.allow_shrink is false" "$tmp/nd-n0.log" ||
    { cat "$tmp/nd-n0.log"; fail "nd: the leader did not name the lost node and runtime.allow_shrink"; }
grep -q "not restarted: joining the nodes: the leader ended the job without this run: node 2 (${NETNS_ADDRS[2]}) closed" \
    "$tmp/nd-n1.log" || { cat "$tmp/nd-n1.log"; fail "nd: node 1 did not stop with the leader's reason"; }
nothing_left nd

# --- a failure no restart cures, on node 2 (its checkpoint shard corrupt): no node restarts -----
cp -a "$tmp/nd.ckpt" "$tmp/pf.ckpt"
shard=$(ls "$tmp"/pf.ckpt/step-*/rank-00002-of-00003.bin | head -n 1)
size=$(stat -c %s "$shard")
printf '\xff\xff\xff\xff' | dd of="$shard" bs=1 seek=$((size - 64)) conv=notrunc status=none
rm -f "$tmp/pf.ckpt/latest" "$tmp/pf.ckpt/fsdpd.lock" "$tmp"/pf.ckpt/fsdpd-rendezvous-*
ln -s "$(basename "$(dirname "$shard")")" "$tmp/pf.ckpt/latest"
t0=$SECONDS
start_nodes pf --runtime.max_restarts=2 --checkpoint.resume=latest
for i in 0 1 2; do expect_exit pf "$i" nonzero; done
[ $((SECONDS - t0)) -lt 15 ] || fail "pf: the nodes took $((SECONDS - t0)) s to stop"
for i in 0 1 2; do
    grep -q "not restarted: a restart cannot cure this" "$tmp/pf-n$i.log" || { cat "$tmp/pf-n$i.log"; fail "pf: node $i did not call it permanent"; }
    ! grep -q "restart [0-9]* of" "$tmp/pf-n$i.log" || { cat "$tmp/pf-n$i.log"; fail "pf: node $i restarted"; }
done
grep -q "rank-00002-of-00003.bin" "$tmp/pf-n0.log" || { cat "$tmp/pf-n0.log"; fail "pf: the leader does not name the corrupt file"; }
nothing_left pf

# --- node 2's daemon killed, allow_shrink: 2 nodes go on --------------------------------------
start_nodes sd --runtime.max_restarts=1 --runtime.allow_shrink=true
wait_for 30 has_latest sd
kill -KILL "${NODE_PIDS[2]}"
expect_exit sd 0 0
expect_exit sd 1 0
grep -q "node(s) 2 gone: going on with 2 of 3 nodes, 2 ranks, accumulation 6 (runtime.allow_shrink)" "$tmp/sd-n0.log" ||
    { cat "$tmp/sd-n0.log"; fail "sd: the leader did not shrink to 2 nodes"; }
from=$(resumed_from "$tmp/sd-n1.log")
[ -n "$from" ] || { cat "$tmp/sd-n1.log"; fail "sd: node 1 did not resume"; }
grep -q "the in-memory checkpoint of step [0-9]* was written by 3 ranks (3 files), this run has 2" "$tmp/sd-n1.log" ||
    { cat "$tmp/sd-n1.log"; fail "sd: node 1 does not say why the memory of 3 ranks does not serve 2"; }
mkdir -p "$tmp/sdref.ckpt"
cp -a "$tmp/sd.ckpt/step-$(printf %06d "$from")" "$tmp/sdref.ckpt/"
ln -s "step-$(printf %06d "$from")" "$tmp/sdref.ckpt/latest"
FSDP_FAULTS="final_params=$tmp/sdref.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
    --runtime.workers_per_node=2 --checkpoint.dir="$tmp/sdref.ckpt" --output.dir="$tmp/sdref.out" \
    --checkpoint.resume=auto > "$tmp/sdref.log" 2>&1 || { cat "$tmp/sdref.log"; fail "sd: the 2-rank resume failed"; }
cmp "$tmp/sdref.safetensors" "$tmp/sd.final.safetensors" ||
    fail "sd: the final parameters differ from step $from's checkpoint resumed on one node of 2 ranks"
nothing_left sd
echo "sd: node 2 gone, 2 nodes went on from step $from: the bits of that checkpoint on 2 ranks"

# --- node 2 stopped (SIGSTOP): found silent, the others go on; node 2 stops once it runs -----
SLOW="step_delay=0:1" start_nodes ss --runtime.max_restarts=1 --runtime.allow_shrink=true --runtime.node_timeout_s=3
wait_for 30 has_latest ss
sleep 2 # past node 2's first heartbeat (heartbeat_s 1): before it, the leader waits join_timeout_s
victims="${NODE_PIDS[2]} $(pid_of_rank "$tmp/ss-n2.log" 1)"
kill -STOP $victims
expect_exit ss 0 0
expect_exit ss 1 0
grep -q "node 2 (${NETNS_ADDRS[2]}) sent nothing for [0-9]* s (runtime.node_timeout_s = 3 s)" "$tmp/ss-n0.log" ||
    { cat "$tmp/ss-n0.log"; fail "ss: the leader did not find node 2 silent"; }
grep -q "going on with 2 of 3 nodes" "$tmp/ss-n0.log" || { cat "$tmp/ss-n0.log"; fail "ss: the leader did not shrink"; }
kill -CONT $victims
expect_exit ss 2 nonzero
grep -q "not restarted: this node lost the leader" "$tmp/ss-n2.log" || { cat "$tmp/ss-n2.log"; fail "ss: node 2 did not stop naming the lost leader"; }
nothing_left ss

# --- a spare node (runtime.spare_nodes=1: nodes 0 and 1 train, node 2 waits) ------------------
reference 2
start_nodes sq --runtime.spare_nodes=1
wait_for 30 has_latest sq
kill -TERM "${NODE_PIDS[2]}" # a spare follows the leader: a signal of its own ends nothing
for i in 0 1 2; do expect_exit sq "$i" 0; done
grep -q "spare node 2 (${NETNS_ADDRS[2]}) joined" "$tmp/sq-n0.log" || { cat "$tmp/sq-n0.log"; fail "sq: the spare did not join"; }
grep -q "run: world size 2 = 2 nodes x 1 worker (and 1 spare node at the start: runtime.spare_nodes)" "$tmp/sq-n0.log" ||
    { cat "$tmp/sq-n0.log"; fail "sq: the run report does not say the world and the spare"; }
grep -q "the job ended without needing this spare node" "$tmp/sq-n2.log" || { cat "$tmp/sq-n2.log"; fail "sq: the spare did not end with the job"; }
[ -z "$(worker_pids "$tmp/sq-n2.log")" ] || fail "sq: the spare started workers"
cmp "$tmp/ref2.safetensors" "$tmp/sq.final.safetensors" || fail "sq: 2 nodes and a spare: not the bits of 2 ranks"
nothing_left sq

start_nodes sp --runtime.spare_nodes=1 --runtime.max_restarts=1
wait_for 30 has_latest sp
# mid-step (0.4 s), once the spare takes copies: a step's seal and its copy are done within
# milliseconds of its end, so node 1 does not die with its newest copy on the way
wait_for 30 grep -q "replicas of the in-memory checkpoints" "$tmp/sp-n2.log"
steps=$(grep -c . "$tmp/sp-n0.jsonl")
wait_for 30 sh -c "[ \$(grep -c . '$tmp/sp-n0.jsonl') -gt $steps ]"
sleep 0.2
kill -KILL "${NODE_PIDS[1]}"
expect_exit sp 0 0
expect_exit sp 2 0
grep -q "node 1 gone: spare node 2 takes its place (runtime.spare_nodes)" "$tmp/sp-n0.log" ||
    { cat "$tmp/sp-n0.log"; fail "sp: the spare did not take node 1's place"; }
[ "$(worker_pids "$tmp/sp-n2.log" | wc -l)" -eq 1 ] || fail "sp: the spare did not start one worker"
# the spare took copies of the nodes' in-memory checkpoints: node 1's become its own, and
# every node resumes from memory
grep -q "this spare's copy of node 1's in-memory checkpoint images becomes its own" "$tmp/sp-n2.log" ||
    { cat "$tmp/sp-n2.log"; fail "sp: the spare did not take node 1's copy as its own"; }
grep -q "resuming from the in-memory checkpoint of step" "$tmp/sp-n0.log" ||
    { cat "$tmp/sp-n0.log" "$tmp/sp-n2.log"; fail "sp: the leader did not resume from memory"; }
cmp "$tmp/ref2.safetensors" "$tmp/sp.final.safetensors" || fail "sp: the final parameters differ from an uninterrupted run's"
nothing_left sp
echo "sq, sp: a spare waits out a run, and takes a lost node's place: the bits of an uninterrupted run"
echo "multinode_restarts: ok"
