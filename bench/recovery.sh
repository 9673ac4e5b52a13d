#!/usr/bin/env bash
# Recovery inside a launch (F48), on this machine's CPUs: 3 nodes (network namespaces, as the
# multi-node tests make them; needs root) of 1 rank each, the small test model, STEPS steps of
# at least DELAY s each (fault step_delay on rank 0), a disk checkpoint every INTERVAL steps.
# Runs the job once without failures, then again killing a worker (kill -9, on nodes 2, 1, 2 in
# turn) FAILURES times, evenly spread, with runtime.max_restarts = FAILURES; both end with the
# same final parameters (checked).  Prints each failure's time from the kill to the restarted
# run's first finished step, and the two runs' wall times and their ratio.
#
#   sudo bench/recovery.sh [BUILD] [STEPS] [DELAY] [INTERVAL] [FAILURES]
set -euo pipefail
export FSDP_BUILD=${1:-build}
STEPS=${2:-200} DELAY=${3:-0.05} INTERVAL=${4:-10} FAILURES=${5:-3}
source "$(dirname "$0")/../tests/integration/lib.sh"
source tests/integration/netns.sh
netns_available || { echo "recovery.sh: $NETNS_WHY" >&2; exit 1; }
make_small_model "$tmp"
make_small_data "$tmp/data.tokens" 400
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--runtime.join_timeout_s=30 --train.micro_batch=1 --train.max_steps="$STEPS"
        --checkpoint.interval_steps="$INTERVAL" --checkpoint.keep=2 --runtime.workers_per_node=1
        --output.consolidate=false --runtime.max_restarts="$FAILURES")
netns_up 3

start() { # JOB: every node in the background, pids in NODE_PIDS
    local i
    NODE_PIDS=()
    for i in 0 1 2; do
        netns_spawn "$i" "$tmp/$1-n$i.log" env SLURM_JOB_ID="$1" SLURM_NNODES=3 SLURM_NODEID="$i" \
            SLURM_JOB_NODELIST="n[0-2]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x3)" \
            FSDP_FAULTS="step_delay=0:$DELAY;final_params=$tmp/$1.safetensors" "$fsdpd" --job "$tmp/job.json" \
            "${common[@]}" --checkpoint.dir="$tmp/$1.ckpt" --output.dir="$tmp/$1.out" --runtime.metrics="$tmp/$1-n$i.jsonl"
        NODE_PIDS+=("$NETNS_PID")
    done
}
finish() { local p; for p in "${NODE_PIDS[@]}"; do wait "$p" || { tail -n 5 "$tmp/$1"-n*.log; exit 1; }; done; }
lines() { cat "$1" 2>/dev/null | grep -c . || true; }
now() { date +%s.%N; }

t0=$(now)
start clean
finish clean
clean_s=$(echo "$(now) - $t0" | bc)

t0=$(now)
start faulty
for ((k = 1; k <= FAILURES; k++)); do
    at=$((STEPS * k / (FAILURES + 1) + INTERVAL / 2)) # mid-interval: the steps since the checkpoint are lost
    while [ "$(lines "$tmp/faulty-n0.jsonl")" -lt "$at" ]; do sleep 0.02; done
    node=$((k % 2 == 1 ? 2 : 1))
    victim=$(worker_pids "$tmp/faulty-n$node.log" | tail -n 1)
    before=$(grep -c '"run_start"' "$tmp/faulty-n0.jsonl")
    kill -KILL "$victim"
    killed=$(now)
    # the restarted run's first step: a metrics line with a run_start after this one
    while [ "$(grep -c '"run_start"' "$tmp/faulty-n0.jsonl")" -le "$before" ]; do sleep 0.01; done
    back=$(now)
    from=$(grep '"run_start"' "$tmp/faulty-n0.jsonl" | tail -n 1 | sed -n 's/.*"from_step":\([0-9]*\).*/\1/p')
    printf "failure %d: rank of node %d killed at step >= %d; %.2f s to the restarted run's first step (resumed from step %s)\n" \
        "$k" "$node" "$at" "$(echo "$back - $killed" | bc)" "$from"
done
finish faulty
faulty_s=$(echo "$(now) - $t0" | bc)
cmp "$tmp/clean.safetensors" "$tmp/faulty.safetensors" || { echo "recovery.sh: the final parameters differ" >&2; exit 1; }
printf "%d steps of >= %s s, a checkpoint every %d: failure-free %.1f s, with %d failures %.1f s: %.2fx (same final parameters)\n" \
    "$STEPS" "$DELAY" "$INTERVAL" "$clean_s" "$FAILURES" "$faulty_s" "$(echo "$faulty_s / $clean_s" | bc -l)"
