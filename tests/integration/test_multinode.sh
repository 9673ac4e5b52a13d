#!/usr/bin/env bash
# Several nodes (F20): one fsdpd per host, the hosts network namespaces (netns.sh) with the
# SLURM variables srun gives, the checkpoint directory shared.  2 nodes x 2 workers and 3
# nodes x 2 workers give the same bits (every loss, the final parameters) as one node with
# the same number of ranks; a stranger at the leader's port is refused and the job goes on;
# a node without the shared directory fails naming it, and the leader names the node that
# never joined; a loopback node address is refused.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"
netns_available || skip_test "$NETNS_WHY"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--checkpoint.save_final=false --output.consolidate=false --checkpoint.resume=never
        --runtime.join_timeout_s=20 --train.micro_batch=1)

# one node, R ranks: the reference
reference() {
    FSDP_FAULTS="final_params=$tmp/ref$1.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --runtime.workers_per_node="$1" --runtime.metrics="$tmp/ref$1.jsonl" > "$tmp/ref$1.log" 2>&1 ||
        { cat "$tmp/ref$1.log"; fail "the one-node run of $1 ranks failed"; }
}

# node I of N under SLURM, in host I, in the background: NETNS_PID
slurm_node() {
    local i=$1 n=$2 job=$3
    shift 3
    netns_spawn "$i" "$tmp/$job-n$i.log" env SLURM_JOB_ID="$job" SLURM_NNODES="$n" SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-$((n - 1))]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x$n)" \
        FSDP_FAULTS="final_params=$tmp/$job.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --runtime.workers_per_node=2 --runtime.metrics="$tmp/$job-n$i.jsonl" "$@"
}

# run_nodes N JOB: every node of the job; all must succeed.
run_nodes() {
    local n=$1 job=$2 i pids=()
    for ((i = 0; i < n; i++)); do slurm_node "$i" "$n" "$job"; pids+=("$NETNS_PID"); done
    for ((i = 0; i < n; i++)); do
        wait "${pids[$i]}" || { tail -n 5 "$tmp/$job"-n*.log; fail "$job: node $i failed"; }
    done
}

losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }
same_bits() { # REFERENCE_RANKS JOB
    cmp <(losses "$tmp/ref$1.jsonl") <(losses "$tmp/$2-n0.jsonl") || fail "$2: losses differ from one node of $1 ranks"
    [ "$(losses "$tmp/$2-n0.jsonl" | wc -l)" -eq 4 ] || fail "$2: expected 4 steps"
    cmp "$tmp/ref$1.safetensors" "$tmp/$2.safetensors" || fail "$2: final parameters differ from one node of $1 ranks"
    echo "$2: the same bits as one node of $1 ranks: $(losses "$tmp/$2-n0.jsonl" | tr '\n' ' ')"
}

netns_up 3
reference 4
reference 6
run_nodes 2 job2
grep -q "node 1 (${NETNS_ADDRS[1]}) joined" "$tmp/job2-n0.log" || { cat "$tmp/job2-n0.log"; fail "job2: no join logged"; }
same_bits 4 job2
run_nodes 3 job3
same_bits 6 job3
[ -z "$(ls "$tmp"/ckpt/fsdpd-rendezvous-* 2>/dev/null)" ] || fail "a rendezvous file was left behind"

# --- a stranger at the leader's port is refused; the job goes on ----------------------------
slurm_node 0 2 job4
leader=$NETNS_PID
# the file itself, not its temporary twin of the atomic write (gone once renamed)
rendezvous="$tmp/ckpt/fsdpd-rendezvous-job4-r0-a0.json"
wait_for 10 test -f "$rendezvous"
port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$rendezvous")
netns_exec 1 python3 -c '
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b"FSDPAUTH" + bytes(72))  # a hello and a proof without the secret
time.sleep(0.5)
s.close()' "${NETNS_ADDRS[0]}" "$port"
wait_for 10 grep -q "refused a connection" "$tmp/job4-n0.log"
[ "$(stat -c %a "$rendezvous")" = 600 ] || fail "the rendezvous file is not 0600"
slurm_node 1 2 job4
follower=$NETNS_PID
wait "$leader" || { cat "$tmp/job4-n0.log"; fail "job4: the leader failed after a stranger"; }
wait "$follower" || { cat "$tmp/job4-n1.log"; fail "job4: the follower failed"; }
grep "refused a connection" "$tmp/job4-n0.log" | head -1

# --- a node without the shared directory ----------------------------------------------------
slurm_node 0 2 job5 --runtime.join_timeout_s=4
leader=$NETNS_PID
netns_spawn_private_dir 1 "$tmp/ckpt" "$tmp/job5-n1.log" env SLURM_JOB_ID=job5 SLURM_NNODES=2 SLURM_NODEID=1 \
    SLURM_JOB_NODELIST="n[0-1]" SLURMD_NODENAME=n1 "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
    --runtime.workers_per_node=2 --runtime.join_timeout_s=4
follower=$NETNS_PID
status=0; wait "$follower" || status=$?
[ "$status" -ne 0 ] || fail "job5: a node without the shared directory exited 0"
grep -q "no rendezvous file $tmp/ckpt/fsdpd-rendezvous-job5-r0-a0.json: checkpoint.dir must be one directory shared by every node" \
    "$tmp/job5-n1.log" || { cat "$tmp/job5-n1.log"; fail "job5: the follower did not name the shared directory"; }
status=0; wait "$leader" || status=$?
[ "$status" -ne 0 ] || fail "job5: the leader exited 0 without its second node"
grep -q "node(s) 1 never joined within runtime.join_timeout_s = 4 s" "$tmp/job5-n0.log" ||
    { cat "$tmp/job5-n0.log"; fail "job5: the leader did not name the missing node"; }

# --- a node address that is loopback, and runtime.bind_addr that mends it ------------------
expect_status 1 "a loopback address" netns_exec 0 env SLURM_JOB_ID=job6 SLURM_NNODES=2 SLURM_NODEID=0 \
    SLURM_JOB_NODELIST="n[0-1]" SLURMD_NODENAME=localhost "$fsdpd" --job "$tmp/job.json" "${common[@]}"
pids=()
for i in 0 1; do
    netns_spawn "$i" "$tmp/job7-n$i.log" env SLURM_JOB_ID=job7 SLURM_NNODES=2 SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-1]" SLURMD_NODENAME=localhost "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --runtime.workers_per_node=2 --runtime.bind_addr="${NETNS_ADDRS[$i]}"
    pids+=("$NETNS_PID")
done
for i in 0 1; do wait "${pids[$i]}" || { tail -n 5 "$tmp"/job7-n*.log; fail "job7: node $i failed with runtime.bind_addr"; }; done
grep -q "leading 2 nodes from ${NETNS_ADDRS[0]}:" "$tmp/job7-n0.log" || fail "job7: the leader did not use runtime.bind_addr"
echo "multinode: ok"
