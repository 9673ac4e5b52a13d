#!/usr/bin/env bash
# The multi-node join against the red team's findings (F35), on netns hosts with CPU workers;
# tests/integration/join_peer.py plays the strangers, the misconfigured node and the fake
# leader a real fsdpd never is:
# 1. 5 silent and 5 dribbling strangers at the leader's port: a node joins beside them, each
#    stranger is dropped after the 5 s handshake deadline and logged, and the job trains;
# 2. a forged rendezvous file (mode 0666, another uid's, a symbolic link) is refused naming it,
#    its owner and mode; a leader's PLAN resuming from outside checkpoint.dir (or through a
#    symbolic link that leads out) is refused;
# 3. a stale rendezvous file of a killed leader (same launch: the follower reads it again
#    until the new leader's comes), one of another SLURM step, and a truncated one are waited
#    past, and the relaunch joins;
# 4. a node with another train.lr (3 nodes) or train.max_steps: every node exits non-zero
#    naming the key and both values;
# 6, 7. admit()'s refusals (a wrong nonce, a node id out of range, another node count,
#    another worker count, a second node 1), each answered with its reason, and a real
#    duplicate fsdpd saying why it was refused; the job then joins and trains;
# and the job secret appears in no argv or environment of fsdpd or its workers, nor in the
# logs, status, metrics or checkpoints.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"
netns_available || skip_test "$NETNS_WHY"
peer=tests/integration/join_peer.py

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--checkpoint.save_final=false --output.consolidate=false --checkpoint.resume=never
        --runtime.join_timeout_s=20 --train.micro_batch=1 --train.max_steps=2)

# node I of N of job JOB in host I, in the background (NETNS_PID); more env before --, then
# fsdpd's overrides.
node() {
    local i=$1 n=$2 job=$3 envs=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    netns_spawn "$i" "$tmp/$job-n$i.log" env SLURM_JOB_ID="$job" SLURM_NNODES="$n" SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-$((n - 1))]" SLURMD_NODENAME="n$i" "${envs[@]+"${envs[@]}"}" \
        "$fsdpd" --job "$tmp/job.json" "${common[@]}" --runtime.workers_per_node=2 \
        --runtime.metrics="$tmp/$job-n$i.jsonl" "$@"
}
# expect_exit STATUS PID LOG: the process ends with STATUS (0, or "fail": non-zero).
expect_exit() {
    local st=0
    wait "$2" || st=$?
    if [ "$1" = fail ]; then [ "$st" -ne 0 ] || { cat "$3"; fail "$3: exited 0"; }
    else [ "$st" -eq "$1" ] || { cat "$3"; fail "$3: exited $st, expected $1"; }; fi
}
must_say() { grep -qF -- "$2" "$1" || { cat "$1"; fail "$1 does not say: $2"; }; }
rendezvous() { echo "$tmp/ckpt/fsdpd-rendezvous-$1-r0-a0.json"; } # JOB
field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

netns_up 3
leader_addr=${NETNS_ADDRS[0]}

# --- 1: strangers who say nothing, or a byte a second, do not stall the join ------------------
node 0 3 quiet; leader=$NETNS_PID
wait_for 10 test -s "$(rendezvous quiet)"
port=$(field "$(rendezvous quiet)" port)
netns_exec 1 python3 "$peer" strangers "$leader_addr" "$port" 5 5 8 > "$tmp/strangers.out" &
strangers=$!
sleep 1
node 1 3 quiet; one=$NETNS_PID                  # joins while the strangers hold their connections
wait_for 4 grep -q "node 1 (${NETNS_ADDRS[1]}) joined" "$tmp/quiet-n0.log"
wait "$strangers" || fail "the strangers' script failed"
must_say "$tmp/strangers.out" "10 of 10 closed by the leader"
[ "$(grep -c "refused a connection from ${NETNS_ADDRS[1]}:[0-9]*: no authentication within 5 s" "$tmp/quiet-n0.log")" -eq 10 ] ||
    { cat "$tmp/quiet-n0.log"; fail "the leader did not log 10 strangers dropped after 5 s"; }
node 2 3 quiet; two=$NETNS_PID                  # after them
expect_exit 0 "$two" "$tmp/quiet-n2.log"
expect_exit 0 "$one" "$tmp/quiet-n1.log"
expect_exit 0 "$leader" "$tmp/quiet-n0.log"
echo "1: 10 strangers dropped after 5 s each, the job joined and trained"

# --- 2: forged rendezvous files and a fake leader's plan -------------------------------------
forged() { # NAME MODE OWNER: a follower alone, facing a forged file; it fails at once
    local file
    file=$(rendezvous "$1")
    echo '{"host":"10.0.0.9","port":9,"nodes":2,"job_id":"x","restart":0,"attempt":0,"secret":"'"$(printf 'ab%.0s' {1..32})"'","nonce":"00","launch":"job '"$1"' step - restart 0 attempt 0","members":[0,1],"ended":""}' > "$file"
    chmod "$2" "$file"
    chown "$3" "$file"
    node 1 2 "$1" -- --runtime.join_timeout_s=4
    expect_exit 1 "$NETNS_PID" "$tmp/$1-n1.log"
    rm -f "$file"
}
mkdir -p "$tmp/ckpt"
forged open 666 0
must_say "$tmp/open-n1.log" "$(rendezvous open): not trusted: readable or writable by others (owner uid 0, mode 0666"
forged other 600 65534
must_say "$tmp/other-n1.log" "$(rendezvous other): not trusted: owned by another user (owner uid 65534, mode 0600"
echo '{}' > "$tmp/elsewhere.json"; chmod 600 "$tmp/elsewhere.json"
ln -s "$tmp/elsewhere.json" "$(rendezvous link)"
node 1 2 link -- --runtime.join_timeout_s=4
expect_exit 1 "$NETNS_PID" "$tmp/link-n1.log"
must_say "$tmp/link-n1.log" "$(rendezvous link): is a symbolic link"
echo "2: forged rendezvous files refused (0666, another uid's, a symbolic link)"

mkdir -p "$tmp/evil/step-000004"
echo '{}' > "$tmp/evil/step-000004/manifest.json"
ln -s "$tmp/evil/step-000004" "$tmp/ckpt/step-000009"
for plan in "$tmp/evil/step-000004" "$tmp/ckpt/step-000009"; do
    netns_exec 0 python3 "$peer" fake-leader "$(rendezvous fake)" "$leader_addr" 2 "job fake step - restart 0 attempt 0" \
        '{"attempt": 1, "resume_dir": "'"$plan"'", "memory_step": -1, "error": ""}' > "$tmp/fake.out" &
    fake=$!
    node 1 2 fake -- --runtime.join_timeout_s=10
    expect_exit 1 "$NETNS_PID" "$tmp/fake-n1.log"
    wait "$fake" || { cat "$tmp/fake.out"; fail "the fake leader failed"; }
    must_say "$tmp/fake.out" planned
    must_say "$tmp/fake-n1.log" "the leader's plan resumes from $plan ($tmp/evil/step-000004), which is not a committed step-N of this job's checkpoint.dir"
done
rm "$tmp/ckpt/step-000009"
echo "2: a plan resuming from outside checkpoint.dir refused, through a symbolic link too"

# --- 3: stale and truncated rendezvous files --------------------------------------------------
node 0 2 stale; old=$NETNS_PID
wait_for 10 test -s "$(rendezvous stale)"
kill -9 "$old"; wait "$old" 2>/dev/null || true
node 1 2 stale; follower=$NETNS_PID                    # finds the dead leader's file first
wait_for 10 grep -q "Connection refused; trying again until runtime.join_timeout_s" "$tmp/stale-n1.log"
node 0 2 stale; leader=$NETNS_PID
expect_exit 0 "$follower" "$tmp/stale-n1.log"
expect_exit 0 "$leader" "$tmp/stale-n0.log"

node 0 2 step SLURM_STEP_ID=0; old=$NETNS_PID           # a first srun's leader, killed
wait_for 10 test -s "$(rendezvous step)"
kill -9 "$old"; wait "$old" 2>/dev/null || true
node 1 2 step SLURM_STEP_ID=1; follower=$NETNS_PID
sleep 1
grep -q "trying again" "$tmp/step-n1.log" && { cat "$tmp/step-n1.log"; fail "the follower tried the other step's leader"; }
node 0 2 step SLURM_STEP_ID=1; leader=$NETNS_PID
expect_exit 0 "$follower" "$tmp/step-n1.log"
expect_exit 0 "$leader" "$tmp/step-n0.log"

printf '{"host": "%s", "po' "$leader_addr" > "$(rendezvous cut)"; chmod 600 "$(rendezvous cut)"
node 1 2 cut; follower=$NETNS_PID
sleep 1
node 0 2 cut; leader=$NETNS_PID
expect_exit 0 "$follower" "$tmp/cut-n1.log"
expect_exit 0 "$leader" "$tmp/cut-n0.log"
echo "3: a killed leader's file, another step's and a truncated one waited past; the relaunches joined"

# --- 4: one job definition on every node ------------------------------------------------------
pids=()
node 0 3 lr; pids+=("$NETNS_PID")
node 1 3 lr; pids+=("$NETNS_PID")
wait_for 20 grep -q "node 1 (${NETNS_ADDRS[1]}) joined" "$tmp/lr-n0.log"   # node 2 comes last
node 2 3 lr -- --train.lr=0.02; pids+=("$NETNS_PID")
for i in 0 1 2; do
    expect_exit fail "${pids[$i]}" "$tmp/lr-n$i.log"
    must_say "$tmp/lr-n$i.log" "node 2 (${NETNS_ADDRS[2]}) runs another job: train.lr is 0.01 on the leader, 0.02 on node 2"
done
node 0 2 steps; leader=$NETNS_PID
node 1 2 steps -- --train.max_steps=3; follower=$NETNS_PID
expect_exit fail "$leader" "$tmp/steps-n0.log"
expect_exit fail "$follower" "$tmp/steps-n1.log"
must_say "$tmp/steps-n1.log" "the leader refused this node: node 1 (${NETNS_ADDRS[1]}) runs another job: train.max_steps is 2 on the leader, 3 on node 1"
echo "4: a node with another train.lr or train.max_steps stops every node, naming the key"

# --- 6, 7: admit()'s refusals, each with its reason; then the job joins ------------------------
node 0 3 admit; leader=$NETNS_PID
wait_for 10 test -s "$(rendezvous admit)"
port=$(field "$(rendezvous admit)" port)
secret=$(field "$(rendezvous admit)" secret)
nonce=$(field "$(rendezvous admit)" nonce)
node 1 3 admit; one=$NETNS_PID
wait_for 20 grep -q "node 1 (${NETNS_ADDRS[1]}) joined" "$tmp/admit-n0.log"
refusal() { # NEEDLE JOIN_FIELDS
    netns_exec 2 python3 "$peer" join "$leader_addr" "$port" "$secret" \
        '{"host": "n2", "settings": {}, "slurm_node": 2, "standby": false, "memory_step": -1, "replica_port": 0, '"$2"'}' > "$tmp/refusal.out"
    grep -q "^REFUSED .*$1" "$tmp/refusal.out" || { cat "$tmp/refusal.out"; fail "no REFUSED saying: $1"; }
    must_say "$tmp/admit-n0.log" "$1"
}
refusal "it did not read this run's rendezvous file" '"node": 2, "nodes": 3, "workers": 2, "nonce": "00"'
refusal "node 5 of 3, but this job has 3 nodes" '"node": 5, "nodes": 3, "workers": 2, "nonce": "'"$nonce"'"'
refusal "node 2 of 2, but this job has 3 nodes" '"node": 2, "nodes": 2, "workers": 2, "nonce": "'"$nonce"'"'
refusal "node 0 of 3, but this job has 3 nodes" '"node": 0, "nodes": 3, "workers": 2, "nonce": "'"$nonce"'"'
refusal "3 workers, the leader has 2" '"node": 2, "nodes": 3, "workers": 3, "nonce": "'"$nonce"'"'
refusal "a second node 1" '"node": 1, "nodes": 3, "workers": 2, "nonce": "'"$nonce"'"'
node 2 3 admit SLURM_NODEID=1 -- --runtime.metrics="$tmp/dup.jsonl"; dup=$NETNS_PID
expect_exit 1 "$dup" "$tmp/admit-n2.log"
must_say "$tmp/admit-n2.log" "the leader refused this node: JOIN from a second node 1 (${NETNS_ADDRS[2]})"
node 2 3 admit; two=$NETNS_PID
expect_exit 0 "$two" "$tmp/admit-n2.log"
expect_exit 0 "$one" "$tmp/admit-n1.log"
expect_exit 0 "$leader" "$tmp/admit-n0.log"
echo "6, 7: every refusal answered with its reason; the job joined and trained after them"

# --- the secret goes nowhere but the rendezvous file ------------------------------------------
both=(--checkpoint.interval_steps=1 --train.max_steps=4)
node 0 2 quiet2 FSDP_FAULTS=step_delay=0:0.4 -- --runtime.status_socket="$tmp/quiet2.sock" "${both[@]}"; leader=$NETNS_PID
wait_for 10 test -s "$(rendezvous quiet2)"
secret=$(field "$(rendezvous quiet2)" secret)
node 1 2 quiet2 FSDP_FAULTS=step_delay=0:0.4 -- "${both[@]}"; follower=$NETNS_PID
wait_for 30 grep -q "step 2/" "$tmp/quiet2-n0.log"
"$fsdpctl" status --json --socket "$tmp/quiet2.sock" > "$tmp/status.json" || fail "status failed"
pids=("$leader" "$follower" $(worker_pids "$tmp/quiet2-n0.log") $(worker_pids "$tmp/quiet2-n1.log"))
[ "${#pids[@]}" -eq 6 ] || fail "expected 2 daemons and 4 workers, found ${#pids[@]} processes"
for p in "${pids[@]}"; do
    for what in cmdline environ; do
        tr '\0' '\n' < "/proc/$p/$what" | grep -q "$secret" && fail "the secret is in process $p's $what"
    done
done
expect_exit 0 "$follower" "$tmp/quiet2-n1.log"
expect_exit 0 "$leader" "$tmp/quiet2-n0.log"
ls "$tmp"/ckpt/step-* > /dev/null || fail "no checkpoint to look into"
looked=("$tmp"/quiet2-n*.log "$tmp"/quiet2-n*.jsonl "$tmp/status.json" "$tmp/ckpt")
if grep -rqsF --exclude='fsdpd-rendezvous-*' "$secret" "${looked[@]}"; then
    fail "the secret is in $(grep -rlsF --exclude='fsdpd-rendezvous-*' "$secret" "${looked[@]}")"
fi
echo "the secret is in no argv, environment, log, status, metrics or checkpoint"
echo "join security: ok"
