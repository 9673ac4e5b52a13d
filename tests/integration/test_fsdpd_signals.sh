#!/usr/bin/env bash
# fsdpd and the signals SLURM (or a user) sends (F17; DESIGN.md, Signals and SLURM):
# - SIGTERM: a synchronous checkpoint of the step in progress, then a stop — no step after the
#   checkpoint; a second SIGTERM while that checkpoint is being made does not abandon it;
# - SIGINT: a stop; a worker that hangs in it is killed after runtime.stop_grace_s; a second
#   SIGINT kills at once;
# - SIGINT, SIGTERM and SIGUSR1 sent to a worker itself: ignored, it keeps training.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# start NAME [overrides...]: fsdpd in the background (environment from $run_env); sets $pid.
run_env=()
start() {
    local name=$1
    shift
    env "${run_env[@]+"${run_env[@]}"}" "$fsdpd" --job "$tmp/job.json" --train.max_steps=100000 \
        --checkpoint.dir="$tmp/$name-ckpt" --runtime.metrics="$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 &
    pid=$!
    bg_pids+=("$pid")
    started_ns=$(date +%s%N)
}
finish() { # NAME SECONDS: waits for $pid; sets $status and $elapsed_ms (since $signalled_ns)
    status=0
    wait_for "$2" sh -c "! kill -0 $pid 2>/dev/null"
    wait "$pid" || status=$?
    elapsed_ms=$(( ($(date +%s%N) - signalled_ns) / 1000000 ))
    assert_gone $(worker_pids "$tmp/$1.log")
}
signal() { signalled_ns=$(date +%s%N); kill "-$1" "$pid"; }
last_step() { tail -1 "$1" | sed -n 's/.*"step":\([0-9]*\).*/\1/p'; }

# --- SIGTERM: a synchronous checkpoint of the current step, and no step after it -------------
start term
wait_for 20 grep -qs "step 20/" "$tmp/term.log"
signal TERM
finish term 20
[ "$status" -eq 1 ] && grep -q "stopped by signal SIGTERM" "$tmp/term.log" || { cat "$tmp/term.log"; fail "SIGTERM: exit $status"; }
saved=$(sed -n 's/.*checkpoint of step \([0-9]*\) (sync) into.*/\1/p' "$tmp/term.log" | tail -1)
[ -n "$saved" ] || { cat "$tmp/term.log"; fail "SIGTERM took no synchronous checkpoint"; }
! grep -q "(async) into" "$tmp/term.log" || { cat "$tmp/term.log"; fail "SIGTERM took an async checkpoint"; }
[ "$(readlink "$tmp/term-ckpt/latest")" = "$(printf 'step-%06d' "$saved")" ] || { ls -l "$tmp/term-ckpt"; fail "latest is not the SIGTERM's checkpoint"; }
[ "$(last_step "$tmp/term.jsonl")" -eq "$saved" ] || fail "training went on after the checkpoint of step $saved: $(last_step "$tmp/term.jsonl")"
echo "SIGTERM: step $saved saved synchronously, the last step run"

# --- a second SIGTERM while the first one's checkpoint is being made: the commit goes on -----
# Rank 1 sleeps 4 s in its first collective, so the step (and the save after it) is still to
# come when both signals arrive; a stop treated as a failure would kill them after 2 s.
run_env=(FSDP_FAULTS=comm_stall=1:1:4)
start term2 --runtime.stop_grace_s=15
run_env=()
wait_for 20 grep -qs "workers ready: training" "$tmp/term2.log"
sleep 0.5
signal TERM
sleep 0.3
kill -TERM "$pid"
finish term2 20
[ "$status" -eq 1 ] || { cat "$tmp/term2.log"; fail "two SIGTERMs: exit $status"; }
grep -q "checkpoint .*/step-[0-9]* committed" "$tmp/term2.log" || { cat "$tmp/term2.log"; fail "the second SIGTERM abandoned the checkpoint"; }
grep -q "SIGTERM again: ignored" "$tmp/term2.log" || { cat "$tmp/term2.log"; fail "the second SIGTERM was not noticed"; }
[ -L "$tmp/term2-ckpt/latest" ] || fail "no latest after two SIGTERMs"
echo "two SIGTERMs: committed $(readlink "$tmp/term2-ckpt/latest") in ${elapsed_ms} ms"

# --- SIGINT: a stop --------------------------------------------------------------------------
start int
wait_for 20 grep -qs "step 2/" "$tmp/int.log"
signal INT
finish int 10
[ "$status" -eq 1 ] && grep -q "stopped by signal SIGINT" "$tmp/int.log" || { cat "$tmp/int.log"; fail "SIGINT: exit $status"; }
! grep -q "killing" "$tmp/int.log" || { cat "$tmp/int.log"; fail "SIGINT: the workers had to be killed"; }

# --- a worker that hangs in the stop: killed after runtime.stop_grace_s (3 s) ----------------
run_env=(FSDP_FAULTS=worker=1:hang_on_stop)
start hang --runtime.stop_grace_s=3
wait_for 20 grep -qs "step 2/" "$tmp/hang.log"
signal INT
finish hang 15
[ "$status" -eq 1 ] && grep -q "killing them" "$tmp/hang.log" || { cat "$tmp/hang.log"; fail "the hung worker was not killed"; }
[ "$elapsed_ms" -ge 2900 ] || fail "the hung worker was killed after ${elapsed_ms} ms, before stop_grace_s (3 s)"
echo "hung worker killed ${elapsed_ms} ms after SIGINT"

# --- a second SIGINT: at once (stop_grace_s is 30 s) -------------------------------------------
start int2 --runtime.stop_grace_s=30
run_env=()
wait_for 20 grep -qs "step 2/" "$tmp/int2.log"
kill -INT "$pid"
sleep 3
kill -0 "$pid" 2>/dev/null || { cat "$tmp/int2.log"; fail "SIGINT did not wait stop_grace_s for the hung worker"; }
signal INT
finish int2 5
[ "$status" -eq 1 ] && grep -q "second SIGINT: stopping at once" "$tmp/int2.log" || { cat "$tmp/int2.log"; fail "second SIGINT: exit $status"; }

# --- SIGINT, SIGTERM, SIGUSR1 sent to the workers themselves: they keep training -------------
start ignore
wait_for 20 grep -qs "step 2/" "$tmp/ignore.log"
workers=$(worker_pids "$tmp/ignore.log")
for sig in INT TERM USR1; do
    kill "-$sig" $workers
    then=$(last_step "$tmp/ignore.jsonl")
    wait_for 10 sh -c "[ \$(tail -1 '$tmp/ignore.jsonl' | sed -n 's/.*\"step\":\([0-9]*\).*/\1/p') -gt $((then + 5)) ]"
    for p in $workers; do kill -0 "$p" 2>/dev/null || { cat "$tmp/ignore.log"; fail "worker $p died of SIG$sig"; }; done
done
! grep -qi "signal\|checkpoint requested\|stopping" "$tmp/ignore.log" || { cat "$tmp/ignore.log"; fail "a signal to a worker changed the job"; }
signal INT
finish ignore 10
echo ok
