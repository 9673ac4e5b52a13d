#!/usr/bin/env bash
# Recovery inside a launch (F48), on this machine's CPUs: 3 nodes (network namespaces, as the
# multi-node tests make them; needs root) of 1 rank each, the small test model, STEPS steps of
# at least DELAY s each (fault step_delay on rank 0), a disk checkpoint every INTERVAL steps.
# Runs the job once without failures, then twice killing a worker (kill -9, on nodes 2, 1, 2 in
# turn) FAILURES times, evenly spread, with runtime.max_restarts = FAILURES: with in-memory
# checkpoints (checkpoint.memory_interval_steps auto: on) and with the disk's alone
# (memory_interval_steps 0); all three end with the same final parameters (checked).  Prints
# each failure's time from the kill to the restarted run's first finished step, the step it
# resumed from, and the time until the run is back at the step it had reached (the steps
# since the checkpoint trained again), and the runs' wall times and their ratios.
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

start() { # JOB [ARGS...]: every node in the background, pids in NODE_PIDS
    local i job=$1
    shift
    NODE_PIDS=()
    for i in 0 1 2; do
        netns_spawn "$i" "$tmp/$job-n$i.log" env SLURM_JOB_ID="$job" SLURM_NNODES=3 SLURM_NODEID="$i" \
            SLURM_JOB_NODELIST="n[0-2]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x3)" \
            FSDP_FAULTS="step_delay=0:$DELAY;final_params=$tmp/$job.safetensors" "$fsdpd" --job "$tmp/job.json" \
            "${common[@]}" --checkpoint.dir="$tmp/$job.ckpt" --output.dir="$tmp/$job.out" \
            --runtime.metrics="$tmp/$job-n$i.jsonl" "$@"
        NODE_PIDS+=("$NETNS_PID")
    done
}
finish() { local p; for p in "${NODE_PIDS[@]}"; do wait "$p" || { tail -n 5 "$tmp/$1"-n*.log; exit 1; }; done; }
last_step() { { tail -n 1 "$1" 2>/dev/null || true; } | sed -n 's/.*"step":\([0-9]*\),.*/\1/p' | grep . || echo 0; }
now() { date +%s.%N; }

t0=$(now)
start clean
finish clean
clean_s=$(echo "$(now) - $t0" | bc)

# faulty JOB ARGS...: the job with FAILURES kills; its wall time in $faulty_s.
faulty() {
    local job=$1 k t0
    shift
    t0=$(now)
    start "$job" "$@"
    for ((k = 1; k <= FAILURES; k++)); do
        at=$((STEPS * k / (FAILURES + 1) + INTERVAL / 2)) # mid-interval: the disk's steps since its checkpoint are lost
        while [ "$(last_step "$tmp/$job-n0.jsonl")" -lt "$at" ]; do sleep 0.02; done
        node=$((k % 2 == 1 ? 2 : 1))
        victim=$(worker_pids "$tmp/$job-n$node.log" | tail -n 1)
        before=$(grep -c '"run_start"' "$tmp/$job-n0.jsonl")
        reached=$(last_step "$tmp/$job-n0.jsonl")
        kill -KILL "$victim"
        killed=$(now)
        # the restarted run's first step: a metrics line with a run_start after this one
        while [ "$(grep -c '"run_start"' "$tmp/$job-n0.jsonl")" -le "$before" ]; do sleep 0.01; done
        back=$(now)
        from=$(grep '"run_start"' "$tmp/$job-n0.jsonl" | tail -n 1 | sed -n 's/.*"from_step":\([0-9]*\).*/\1/p')
        while ! tail -n 1 "$tmp/$job-n0.jsonl" | grep -q "\"step\":$((reached + 1)),"; do sleep 0.01; done
        again=$(now)
        printf "%s failure %d: rank of node %d killed after step %d; %.2f s to the restarted run's first step (resumed from step %s), %.2f s to step %d\n" \
            "$job" "$k" "$node" "$reached" "$(echo "$back - $killed" | bc)" "$from" "$(echo "$again - $killed" | bc)" "$((reached + 1))"
    done
    finish "$job"
    faulty_s=$(echo "$(now) - $t0" | bc)
    cmp "$tmp/clean.safetensors" "$tmp/$job.safetensors" || { echo "recovery.sh: $job: the final parameters differ" >&2; exit 1; }
    printf "%s: %d steps of >= %s s, a disk checkpoint every %d: failure-free %.1f s, with %d failures %.1f s: %.2fx (same final parameters)\n" \
        "$job" "$STEPS" "$DELAY" "$INTERVAL" "$clean_s" "$FAILURES" "$faulty_s" "$(echo "$faulty_s / $clean_s" | bc -l)"
}
faulty memory
faulty disk --checkpoint.memory_interval_steps=0
