#!/usr/bin/env bash
# fsdpd under a real SLURM (F22): tests/slurm/cluster.sh starts SLURM 22.05 with two compute
# nodes on this machine, and slurm/launch.slurm runs the small CPU job (2 ranks) in three
# scenarios, each ending with the same final parameters (bits) as one uninterrupted run
# outside SLURM:
# - 2 nodes x 1 worker (sbatch --nodes=2): the nodes meet through PMIx (srun --mpi=pmix; the
#   rendezvous file carries the nonce, not the secret), and `fsdpctl status` answers from the
#   submitting host through the command the log gives (srun --overlap --jobid): the job's
#   TMPDIR is node-local, so the same query on the submitting host finds nothing;
# - scancel: fsdpd gets the same SIGTERM, commits a checkpoint, and does not requeue the
#   cancelled job (it is COMPLETING, no longer RUNNING);
# - a user's `scontrol requeue`: the same SIGTERM, a checkpoint; SLURM requeues the job itself
#   (Restarts is past the run's SLURM_RESTART_COUNT), fsdpd says so and does not requeue it
#   again; the next run resumes and finishes;
# - preemption (1 node): a job of partition "high" takes the nodes of the running job (partition
#   "low", GraceTime): fsdpd commits a checkpoint, requeues the job itself, exits 0; the
#   requeued run (Restarts=1) resumes from `latest` and finishes;
# - the time limit on 2 nodes (--time=1 --signal=USR1@30): SIGUSR1, a checkpoint across the
#   nodes, a requeue by the leader, and the requeued runs resume and finish.  (The warning 30 s
#   before the limit leaves each run ~30 s: with 45 a run got ~15, of which start-up took half
#   on a busy 2-core machine, and the six requeues and their waits ran past the 300 s bound.)
# Every scenario checks how often the job was requeued (Restarts) and that only the leader's
# log says it requeued the job.
# Needs root, SLURM (slurmctld, slurmd, munge, the PMIx plugin) and network namespaces.
# schedule: first (~200 s, mostly waiting on SLURM: tests/run.sh runs the others beside it)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"
source "$(dirname "$0")/../slurm/cluster.sh"
slurm_available || skip_test "$SLURM_WHY"

steps=40
abs_build=$(cd "$build" && pwd)
make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
FSDP_FAULTS="final_params=$tmp/ref.safetensors" "$fsdpd" --job "$tmp/job.json" --train.max_steps=$steps \
    --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false \
    --checkpoint.dir="$tmp/ref-ckpt" --runtime.metrics="$tmp/ref.jsonl" > "$tmp/ref.log" 2>&1 ||
    { cat "$tmp/ref.log"; fail "the reference run failed"; }

slurm_cluster_up

# submit NAME DELAY SBATCH_OPTION... -- OVERRIDE...: sbatch slurm/launch.slurm from n0, rank 0
# sleeping DELAY s before each optimizer step (a slower job, the same bits); prints the job id.
submit() {
    local name=$1 delay=$2 opts=()
    shift 2
    while [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
    slurm_cmd env TMPDIR="$SLURM_NODE_TMP" FSDP_BUILD="$abs_build" \
        FSDP_FAULTS="final_params=$tmp/$name.safetensors;step_delay=0:$delay" \
        sbatch --parsable --output="$tmp/$name.out" "${opts[@]}" slurm/launch.slurm "$tmp/job.json" \
        --train.max_steps=$steps --checkpoint.dir="$tmp/$name-ckpt" --output.dir="$tmp/$name-out" \
        --runtime.metrics="$tmp/$name.jsonl" "$@" | cut -d';' -f1
}
same_bits() { # NAME
    cmp "$tmp/ref.safetensors" "$tmp/$1.safetensors" || { cat "$tmp/$1.out"; fail "$1: final parameters differ from the uninterrupted run"; }
    echo "$1: the same final bits as the uninterrupted run"
}
# requeues NAME JOBID N: SLURM counts N requeues of the job (Restarts), and the leader's log
# says it requeued the job itself as often as SLURM counts (SELF: "self", else the number of
# requeues fsdpd did not do: a user's); no other node ever requeues.
requeues() {
    local restarts self follower
    restarts=$(slurm_job_field "$2" Restarts)
    self=$(grep -c "fsdpd node 0: .*: job $2 requeued (scontrol requeue)" "$tmp/$1.out" || true)
    follower=$(grep -c "fsdpd node [1-9][0-9]*: .*job $2 requeued" "$tmp/$1.out" || true)
    [ "$restarts" = "$3" ] || { cat "$tmp/$1.out"; fail "$1: job $2 was requeued $restarts times, expected $3"; }
    [ "$self" -eq $(($3 - ${4:-0})) ] || { cat "$tmp/$1.out"; fail "$1: the leader says it requeued $self times, expected $(($3 - ${4:-0}))"; }
    [ "$follower" -eq 0 ] || { cat "$tmp/$1.out"; fail "$1: a follower requeued the job"; }
}
finished() { # NAME JOBID SECONDS: the job ends COMPLETED, exit code 0
    local state
    state=$(slurm_wait_end "$2" "$3")
    [ "$state" = COMPLETED ] && [ "$(slurm_job_field "$2" ExitCode)" = "0:0" ] ||
        { cat "$tmp/$1.out"; fail "$1: job $2 ended $state, exit code $(slurm_job_field "$2" ExitCode)"; }
}

# --- 2 nodes, PMIx, status from the submitting host ------------------------------------------
t0=$SECONDS
id=$(submit two 0.3 --nodes=2 -- --runtime.workers_per_node=1 --checkpoint.resume=never --output.consolidate=false)
wait_for 90 grep -qs "step 3/" "$tmp/two.out"
file=$(ls "$tmp"/two-ckpt/fsdpd-rendezvous-"$id"-*.json)
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["secret"] == "" and len(r["nonce"]) == 32, r' "$file" ||
    fail "two: the rendezvous file under PMIx holds a secret, or no nonce: $(cat "$file")"
query=$(sed -n 's/^fsdpd-launch: status: //p' "$tmp/two.out" | head -1)
[ -n "$query" ] || { cat "$tmp/two.out"; fail "two: the log does not say how to ask for the status"; }
# shellcheck disable=SC2086  # the command line the log gives, word by word
slurm_cmd $query > "$tmp/status.out" 2>&1 || { cat "$tmp/status.out"; fail "two: '$query' failed"; }
grep -q "^job $id (node 0, restart 0" "$tmp/status.out" || { cat "$tmp/status.out"; fail "two: the status is not the job's"; }
! slurm_cmd env TMPDIR="$SLURM_NODE_TMP" "$abs_build/fsdpctl" status --job-id "$id" > "$tmp/local.out" 2>&1 ||
    fail "two: fsdpctl status found the job on the submitting host (the node-local TMPDIR is shared?)"
finished two "$id" 120
grep -q "PMIx: published the leader's address" "$tmp/two.out" && grep -q "node 1: PMIx: the leader is at" "$tmp/two.out" ||
    { cat "$tmp/two.out"; fail "two: the nodes did not meet through PMIx"; }
grep -q "node 0: job .*checkpoints in $tmp/two-ckpt, output in $tmp/two-out" "$tmp/two.out" ||
    { cat "$tmp/two.out"; fail "two: the log does not say where checkpoints and output are"; }
same_bits two
requeues two "$id" 0
echo "two nodes: $((SECONDS - t0)) s"

# --- scancel: the same SIGTERM, but the job is COMPLETING: a checkpoint, no requeue ----------
id=$(submit cancel 0.3 --nodes=1 -- --checkpoint.resume=auto --output.consolidate=false)
wait_for 90 grep -qs "step 3/" "$tmp/cancel.out"
slurm_cmd scancel "$id"
state=$(slurm_wait_end "$id" 60)
[ "$state" = CANCELLED ] && [ "$(slurm_job_field "$id" Restarts)" = 0 ] ||
    { cat "$tmp/cancel.out"; fail "cancel: job $id ended $state after $(slurm_job_field "$id" Restarts) requeues"; }
wait_for 20 grep -qs "no requeue: job $id is COMPLETING, not RUNNING" "$tmp/cancel.out" ||
    { cat "$tmp/cancel.out"; fail "cancel: fsdpd does not say why it did not requeue"; }
requeues cancel "$id" 0

# --- a user's scontrol requeue: SLURM requeues the job; fsdpd checkpoints, does not requeue it
# again, and says so (not an error); the next run resumes -------------------------------------
id=$(submit user 0.3 --nodes=1 -- --checkpoint.resume=auto --output.consolidate=false)
wait_for 90 grep -qs "step 3/" "$tmp/user.out"
slurm_cmd scontrol requeue "$id"
finished user "$id" 150
grep -q "stopped by signal SIGTERM after the checkpoint of step [0-9]*: SLURM is requeueing job $id already" "$tmp/user.out" ||
    { cat "$tmp/user.out"; fail "user: fsdpd does not say SLURM requeued the job"; }
! grep -q "no requeue" "$tmp/user.out" || { cat "$tmp/user.out"; fail "user: fsdpd took the user's requeue for an error"; }
requeues user "$id" 1 1
same_bits user

# --- preemption: checkpoint, requeue, resume ---------------------------------------------------
t0=$SECONDS
id=$(submit pre 0.5 --nodes=1 --partition=low -- --checkpoint.resume=auto --output.consolidate=false)
wait_for 90 grep -qs "step 6/" "$tmp/pre.out"
high=$(slurm_cmd sbatch --parsable --partition=high --nodes=2 --exclusive --output="$tmp/high.out" --wrap "sleep 1" | cut -d';' -f1)
finished high "$high" 90
finished pre "$id" 150
grep -q "stopped by signal SIGTERM after the checkpoint of step [0-9]*: job $id requeued" "$tmp/pre.out" ||
    { cat "$tmp/pre.out"; fail "pre: fsdpd did not requeue its job after the preemption"; }
requeues pre "$id" 1
grep -q "fsdpd-launch: job $id, run 1 " "$tmp/pre.out" && grep -q "resum.*step-0" "$tmp/pre.out" ||
    { cat "$tmp/pre.out"; fail "pre: the requeued run did not resume"; }
same_bits pre
echo "preemption: $((SECONDS - t0)) s"

# --- the time limit: SIGUSR1, checkpoint, requeue, resume --------------------------------------
t0=$SECONDS
id=$(submit limit 1.4 --nodes=2 --time=1 --signal=USR1@30 -- --runtime.workers_per_node=1 --checkpoint.resume=auto \
     --output.consolidate=false)
finished limit "$id" 300
grep -q "stopped by signal SIGUSR1 after the checkpoint of step [0-9]*: job $id requeued" "$tmp/limit.out" ||
    { cat "$tmp/limit.out"; fail "limit: fsdpd did not requeue its job on the time-limit warning"; }
same_bits limit
n=$(slurm_job_field "$id" Restarts)
[ "$n" -ge 1 ] || { cat "$tmp/limit.out"; fail "limit: the job was never requeued"; }
requeues limit "$id" "$n"
echo "time limit: $((SECONDS - t0)) s, $n requeue(s), each by the leader"
echo "slurm: ok"
