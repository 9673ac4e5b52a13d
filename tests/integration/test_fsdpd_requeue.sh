#!/usr/bin/env bash
# fsdpd requeues its own SLURM job (F22; daemon/requeue.h), here with SLURM's variables and a
# stand-in scontrol that records its calls (tests/integration/test_slurm.sh does it against
# a real SLURM):
# - SIGTERM (a preemption): a synchronous checkpoint, `scontrol requeue JOB`, exit 0;
# - SIGUSR1 under SLURM (runtime.on_usr1 auto: the time-limit warning): the same, training
#   does not go on; with runtime.on_usr1=checkpoint it does;
# - the requeued run resumes from `latest`; stopped without committing a checkpoint past it
#   (its stop checkpoint stalls), it does not requeue (exit 1, scontrol not run); nor when the
#   job is no longer RUNNING (scancel);
# - outside SLURM, SIGTERM still exits 1 without a requeue;
# - a SIGUSR1 before the supervisor listens (here: while node 1 waits for the rendezvous
#   file) does not kill fsdpd.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
mkdir -p "$tmp/bin"
# scontrol show job: JobState=$FAKE_JOB_STATE (RUNNING by default); scontrol requeue: recorded.
cat > "$tmp/bin/scontrol" <<SH
#!/bin/sh
if [ "\$1" = show ]; then echo "JobId=4242 JobName=fsdpd JobState=\${FAKE_JOB_STATE:-RUNNING} Reason=None"; exit 0; fi
echo "\$*" >> "$tmp/scontrol.calls"
SH
chmod +x "$tmp/bin/scontrol"
slurm_env=(PATH="$tmp/bin:$PATH" SLURM_JOB_ID=4242 SLURM_NNODES=1 SLURM_NODEID=0 SLURM_JOB_NODELIST=n0
           SLURMD_NODENAME=n0 SLURM_TASKS_PER_NODE=1)

# start NAME ENV... -- OVERRIDES...: fsdpd in the background; sets $pid.
start() {
    local name=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]+"${envs[@]}"}" "$fsdpd" --job "$tmp/job.json" --train.max_steps=100000 \
        --checkpoint.dir="$tmp/ckpt" --runtime.metrics="$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 &
    pid=$!
    bg_pids+=("$pid")
}
finish() { # NAME: waits for $pid; sets $status
    status=0
    wait_for 30 sh -c "! kill -0 $pid 2>/dev/null"
    wait "$pid" || status=$?
    assert_gone $(worker_pids "$tmp/$1.log")
}
calls() { cat "$tmp/scontrol.calls" 2>/dev/null || true; }
last_step() { tail -1 "$1" | sed -n 's/.*"step":\([0-9]*\).*/\1/p'; }
saved_step() { sed -n 's/.*checkpoint of step \([0-9]*\) (sync) into.*/\1/p' "$1" | tail -1; }

# --- SIGTERM under SLURM: checkpoint, requeue, exit 0 ----------------------------------------
start term "${slurm_env[@]}" -- --checkpoint.resume=never
wait_for 20 grep -qs "step 5/" "$tmp/term.log"
kill -TERM "$pid"
finish term
[ "$status" -eq 0 ] || { cat "$tmp/term.log"; fail "SIGTERM under SLURM: exit $status, expected 0"; }
[ "$(calls)" = "requeue 4242" ] || { cat "$tmp/term.log"; fail "SIGTERM: scontrol was run as '$(calls)'"; }
saved=$(saved_step "$tmp/term.log")
grep -q "stopped by signal SIGTERM after the checkpoint of step $saved: job 4242 requeued" "$tmp/term.log" ||
    { cat "$tmp/term.log"; fail "SIGTERM: the requeue is not logged"; }
echo "SIGTERM: step $saved committed, job requeued"

# --- the requeued run resumes; a SIGUSR1 (auto: requeue under SLURM) stops it for a requeue --
rm -f "$tmp/scontrol.calls"
start usr1 "${slurm_env[@]}" SLURM_RESTART_COUNT=1 -- --checkpoint.resume=auto
wait_for 20 grep -qs "step $((saved + 3))/" "$tmp/usr1.log"
kill -USR1 "$pid"
finish usr1
[ "$status" -eq 0 ] || { cat "$tmp/usr1.log"; fail "SIGUSR1 under SLURM: exit $status, expected 0"; }
grep -q "resum.*step-$(printf %06d "$saved")" "$tmp/usr1.log" || { cat "$tmp/usr1.log"; fail "the requeued run did not resume from step $saved"; }
[ "$(calls)" = "requeue 4242" ] || { cat "$tmp/usr1.log"; fail "SIGUSR1: scontrol was run as '$(calls)'"; }
saved2=$(saved_step "$tmp/usr1.log")
[ "$(last_step "$tmp/usr1.jsonl")" -eq "$saved2" ] || fail "SIGUSR1: training went on after the checkpoint of step $saved2"
echo "SIGUSR1: resumed from step $saved, step $saved2 committed, job requeued"

# --- its stop checkpoint never commits (rank 0 stalls writing it; runtime.stop_grace_s ends
# it): nothing past the checkpoint it resumed from, so no requeue ---------------------------
rm -f "$tmp/scontrol.calls"
start again "${slurm_env[@]}" SLURM_RESTART_COUNT=2 FSDP_FAULTS=ckpt_write=0:stall -- --checkpoint.resume=auto \
    --runtime.stop_grace_s=2
wait_for 20 grep -qs "step $((saved2 + 2))/" "$tmp/again.log"
kill -TERM "$pid"
finish again
[ "$status" -eq 1 ] || { cat "$tmp/again.log"; fail "a run without a new checkpoint: exit $status, expected 1"; }
[ -z "$(calls)" ] || fail "a run without a new checkpoint requeued its job: $(calls)"
grep -q "not requeued: no checkpoint committed since this run started" "$tmp/again.log" ||
    { cat "$tmp/again.log"; fail "the refused requeue is not explained"; }
[ "$(readlink "$tmp/ckpt/latest")" = "$(printf 'step-%06d' "$saved2")" ] || fail "latest moved"

# --- cancelled (scancel: SIGTERM, the job COMPLETING): a checkpoint, no requeue ------------
rm -f "$tmp/scontrol.calls"
start cancel "${slurm_env[@]}" FAKE_JOB_STATE=COMPLETING -- --checkpoint.resume=auto
wait_for 20 grep -qs "step $((saved2 + 2))/" "$tmp/cancel.log"
kill -TERM "$pid"
finish cancel
[ "$status" -eq 1 ] || { cat "$tmp/cancel.log"; fail "a cancelled job: exit $status, expected 1"; }
[ -z "$(calls)" ] || fail "a cancelled job was requeued: $(calls)"
grep -q "no requeue: job 4242 is COMPLETING, not RUNNING" "$tmp/cancel.log" || { cat "$tmp/cancel.log"; fail "the cancelled job's stop is not explained"; }

# --- runtime.on_usr1=checkpoint under SLURM: a checkpoint, training goes on -------------------
start ckpt "${slurm_env[@]}" -- --checkpoint.resume=never --checkpoint.dir="$tmp/ckpt2" --runtime.on_usr1=checkpoint
wait_for 20 grep -qs "step 3/" "$tmp/ckpt.log"
kill -USR1 "$pid"
wait_for 20 grep -qs "checkpoint .*committed" "$tmp/ckpt.log"
then=$(last_step "$tmp/ckpt.jsonl")
wait_for 20 sh -c "[ \$(tail -1 '$tmp/ckpt.jsonl' | sed -n 's/.*\"step\":\([0-9]*\).*/\1/p') -gt $((then + 2)) ]"
kill -INT "$pid"
finish ckpt
[ -z "$(calls)" ] || fail "runtime.on_usr1=checkpoint requeued the job"

# --- outside SLURM: SIGTERM exits 1, no requeue ----------------------------------------------
start plain PATH="$tmp/bin:$PATH" -- --checkpoint.resume=never --checkpoint.dir="$tmp/ckpt3"
wait_for 20 grep -qs "step 2/" "$tmp/plain.log"
kill -TERM "$pid"
finish plain
[ "$status" -eq 1 ] && grep -q "stopped by signal SIGTERM" "$tmp/plain.log" || { cat "$tmp/plain.log"; fail "SIGTERM outside SLURM: exit $status"; }
[ -z "$(calls)" ] || fail "fsdpd outside SLURM ran scontrol"

# --- SIGUSR1 before the supervisor listens: fsdpd lives on ------------------------------------
# Node 1 of 2 waits for a rendezvous file nobody writes (its name, an address, need not be
# this machine's: it only tells the leader where it is).
start early "${slurm_env[@]}" SLURM_NNODES=2 SLURM_NODEID=1 SLURM_JOB_NODELIST="10.9.9.8,10.9.9.9" \
    SLURMD_NODENAME=10.9.9.9 SLURM_TASKS_PER_NODE="1(x2)" -- --checkpoint.resume=never --checkpoint.dir="$tmp/ckpt4" \
    --checkpoint.save_final=false --output.consolidate=false --runtime.join_timeout_s=4
sleep 1.5
kill -USR1 "$pid"
finish early
[ "$status" -eq 1 ] && grep -q "no rendezvous file" "$tmp/early.log" ||
    { cat "$tmp/early.log"; fail "a SIGUSR1 before the supervisor: exit $status (138: killed by it)"; }
echo "requeue: ok"
