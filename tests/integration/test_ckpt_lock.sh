#!/usr/bin/env bash
# One job per checkpoint directory (F36): the leader holds checkpoint.dir's lock
# (CKPT/fsdpd.lock) for the job's life.  Reproducing the finding: two jobs started at once on
# one checkpoint.dir (seeds 1 and 2) — the second is refused within a second, naming the
# holder (its pid), and the first is unharmed: its final parameters are identical, bit for
# bit, to a lone run's.  A lock left by a killed job (its pid gone) is taken over with a log
# line; a lock naming a job on another host is refused while SLURM says that job runs or is
# pending, taken over once it says the job ended, and refused when nothing can tell.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--train.max_steps=6 --checkpoint.interval_steps=2 --checkpoint.async=true)

# --- the lone run -------------------------------------------------------------------------------
run_job lone final_params="$tmp/lone.safetensors" -- "${common[@]}" --checkpoint.dir="$tmp/ck-lone" --train.seed=1
must_succeed lone

# --- two at once ---------------------------------------------------------------------------------
FSDP_FAULTS="final_params=$tmp/a.safetensors;step_delay=0:0.4" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
    --checkpoint.dir="$tmp/ck" --train.seed=1 --runtime.metrics="$tmp/a.jsonl" > "$tmp/a.log" 2>&1 &
apid=$!
bg_pids+=("$apid")
wait_for 20 grep -qs "\"pid\":$apid," "$tmp/ck/fsdpd.lock"
t0=$(date +%s.%N)
run_job b -- "${common[@]}" --checkpoint.dir="$tmp/ck" --train.seed=2
t1=$(date +%s.%N)
[ "$status" -ne 0 ] || { cat "$tmp/b.log"; fail "the second job was not refused"; }
grep -qF "checkpoint.dir $tmp/ck is in use by another job (host $(hostname), pid $apid" "$tmp/b.log" ||
    { cat "$tmp/b.log"; fail "the refusal does not name the holder"; }
awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 1.0) }' || fail "the refusal took $(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') s"
kill -0 "$apid" 2>/dev/null || fail "the first job did not outlive the refusal"
status=0
wait "$apid" || status=$?
[ "$status" -eq 0 ] || { cat "$tmp/a.log"; fail "the first job failed"; }
cmp "$tmp/lone.safetensors" "$tmp/a.safetensors" || fail "the first job's final parameters differ from a lone run's"
grep -q '"seed": 1,' "$tmp/ck/step-000006/manifest.json" || fail "the checkpoint is not the first job's"
[ ! -s "$tmp/ck/fsdpd.lock" ] || fail "the lock was not released at the end: $(cat "$tmp/ck/fsdpd.lock")"
echo "two at once: the second refused in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s, the first identical to a lone run"

# --- a killed holder's lock is stale: taken over ------------------------------------------------
FSDP_FAULTS="step_delay=0:0.4" "$fsdpd" --job "$tmp/job.json" "${common[@]}" --checkpoint.dir="$tmp/ck2" \
    --runtime.metrics="$tmp/k.jsonl" > "$tmp/k.log" 2>&1 &
kpid=$!
bg_pids+=("$kpid")
wait_for 20 grep -qs "\"pid\":$kpid," "$tmp/ck2/fsdpd.lock"
kill -9 "$kpid"
wait "$kpid" 2>/dev/null || true
run_job taker -- "${common[@]}" --checkpoint.dir="$tmp/ck2" --train.max_steps=2
must_succeed taker
grep -qF "taking over the stale lock $tmp/ck2/fsdpd.lock of host $(hostname), pid $kpid" "$tmp/taker.log" &&
    grep -qF "its process $kpid is gone" "$tmp/taker.log" || { cat "$tmp/taker.log"; fail "no take-over logged"; }
echo "a killed job's lock: taken over"

# --- a lock of a job on another host: refused, naming the file to remove ------------------------
mkdir -p "$tmp/ck3"
printf '{"format":"fsdpd-lock","version":1,"job_id":"4711","host":"elsewhere","pid":1234,"start_time":99,"boot_id":"x","started":1700000000}' \
    > "$tmp/ck3/fsdpd.lock"
run_job remote -- "${common[@]}" --checkpoint.dir="$tmp/ck3"
[ "$status" -ne 0 ] || fail "a lock of another host's job was ignored"
grep -qF "is locked by a job on another host (SLURM job 4711, host elsewhere, pid 1234" "$tmp/remote.log" &&
    grep -qF "remove $tmp/ck3/fsdpd.lock" "$tmp/remote.log" || { cat "$tmp/remote.log"; fail "no reason given"; }
# SLURM says what became of that job: a stand-in scontrol that knows job 4711 as $STATE
# (gone: "Invalid job id").
mkdir -p "$tmp/bin"
cat > "$tmp/bin/scontrol" <<'SH'
#!/bin/sh
[ "$1 $2 $3 $4" = "show job -o 4711" ] || exit 2
[ "$STATE" = gone ] && { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
echo "JobId=4711 JobName=fsdpd UserId=root(0) JobState=$STATE Reason=None Restarts=0 BatchFlag=1"
SH
chmod +x "$tmp/bin/scontrol"
for state in RUNNING PENDING; do
    PATH="$tmp/bin:$PATH" STATE=$state run_job "slurm-$state" -- "${common[@]}" --checkpoint.dir="$tmp/ck3"
    [ "$status" -ne 0 ] || fail "a lock of job 4711, $state on another host, was taken"
    grep -qF "is in use by another job (SLURM job 4711, host elsewhere, pid 1234" "$tmp/slurm-$state.log" ||
        { cat "$tmp/slurm-$state.log"; fail "no reason given for job 4711 $state"; }
done
cp "$tmp/ck3/fsdpd.lock" "$tmp/remote.lock"
for state in COMPLETED gone; do
    cp "$tmp/remote.lock" "$tmp/ck3/fsdpd.lock"
    PATH="$tmp/bin:$PATH" STATE=$state run_job "slurm-$state" -- "${common[@]}" --checkpoint.dir="$tmp/ck3" --train.max_steps=2
    must_succeed "slurm-$state"
    want="SLURM says job 4711 is COMPLETED"; [ "$state" = gone ] && want="SLURM no longer knows job 4711"
    grep -qF "taking over the stale lock $tmp/ck3/fsdpd.lock of SLURM job 4711, host elsewhere" "$tmp/slurm-$state.log" &&
        grep -qF "$want" "$tmp/slurm-$state.log" || { cat "$tmp/slurm-$state.log"; fail "no take-over of job 4711 ($state)"; }
done
echo "another host's lock: kept while SLURM runs or queues its job, taken over once SLURM says it ended"
printf 'garbage' > "$tmp/ck3/fsdpd.lock"
run_job garbage -- "${common[@]}" --checkpoint.dir="$tmp/ck3"
[ "$status" -ne 0 ] || fail "a corrupt lock file was ignored"
grep -qF "lock file is not one fsdpd wrote" "$tmp/garbage.log" || { cat "$tmp/garbage.log"; fail "no reason given"; }
echo "another host's lock, a corrupt lock file: refused"
echo ok
