#!/usr/bin/env bash
# Failed saves surface (F36), reproducing the finding: with checkpoint.async true (the default)
# on a full checkpoint file system, every save used to be "abandoned ... training goes on" and
# the job failed only at its final save.  Now each failed save is logged with the count of
# failures in a row; a failed save is retried once, synchronously, before it counts, and after
# checkpoint.max_failed_saves (3) the job stops, non-zero, naming the error, long before its
# last step; `latest` is intact and resumes once there is space.  Single node: checkpoint.dir
# on a small tmpfs, filled mid-run.  Two nodes (network namespaces): node 1 sees checkpoint.dir
# read-only (a read-only bind mount in its own mount namespace), node 0 writes fine.
source "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || skip_test "mounting a tmpfs needs root"
make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
mnt=$tmp/fs
mkdir -p "$mnt"
mount -t tmpfs -o size=16m tmpfs "$mnt" || skip_test "cannot mount a tmpfs here"
trap 'umount -l "$mnt" 2>/dev/null || true; cleanup' EXIT
source "$(dirname "$0")/netns.sh" # chains its clean-up onto this trap
ck=$mnt/ck
common=(--checkpoint.dir="$ck" --checkpoint.interval_steps=1 --checkpoint.async=true --checkpoint.resume=auto)

# --- a first run commits steps 1-2 ---------------------------------------------------------------
run_job first -- "${common[@]}" --train.max_steps=2
must_succeed first
[ "$(readlink "$ck/latest")" = step-000002 ] || fail "latest is not step-000002"
cp -a "$ck/step-000002" "$tmp/step2"

# --- the resumed run: the file system fills after its start --------------------------------------
FSDP_FAULTS="step_delay=0:0.3" "$fsdpd" --job "$tmp/job.json" "${common[@]}" --train.max_steps=40 \
    --runtime.metrics="$tmp/full.jsonl" > "$tmp/full.log" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_for 30 grep -q "rank 0: started" "$tmp/full.log"
dd if=/dev/zero of="$mnt/fill" bs=1M 2>/dev/null || true # until ENOSPC
status=0
wait "$pid" || status=$?
[ "$status" -ne 0 ] || { cat "$tmp/full.log"; fail "the job trained on with no checkpoint"; }
grep -qF "3 consecutive checkpoint saves failed (checkpoint.max_failed_saves)" "$tmp/full.log" &&
    grep -q "No space left on device" "$tmp/full.log" || { cat "$tmp/full.log"; fail "the stop does not name the error"; }
grep -q "retrying it synchronously at the next step before it counts" "$tmp/full.log" &&
    grep -q "checkpoint requested (retrying a failed save): asking the workers (request [0-9]*, synchronous)" "$tmp/full.log" ||
    { cat "$tmp/full.log"; fail "no synchronous retry asked for"; }
grep -q "checkpoint of step [0-9]* (sync) into" "$tmp/full.log" || { cat "$tmp/full.log"; fail "the retry was not synchronous"; }
grep -q "1 consecutive failed checkpoint save (checkpoint.max_failed_saves = 3)" "$tmp/full.log" || fail "no count logged"
last=$(sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$tmp/full.jsonl" | tail -1)
[ "$last" -lt 30 ] || fail "the job ran to step $last before stopping"
grep -q "restart 1 of" "$tmp/full.log" && fail "a full file system was restarted"
latest=$(readlink "$ck/latest")
[ -f "$ck/$latest/manifest.json" ] || fail "latest ($latest) is not a committed checkpoint"
echo "full file system: stopped after step $last, 3 counted failures, latest $latest intact"

# --- space again: latest resumes ------------------------------------------------------------------
rm -f "$mnt/fill"
run_job again -- "${common[@]}" --train.max_steps=$((last + 2))
must_succeed again
grep -q "resuming from $ck/$latest" "$tmp/again.log" || { cat "$tmp/again.log"; fail "latest did not resume"; }
echo "latest resumed once there was space"

# --- two nodes, node 1's view of checkpoint.dir read-only ----------------------------------------
netns_available || skip_test "$NETNS_WHY"
netns_up 2
mck=$tmp/mck
mkdir -p "$mck"
node() { # I CMD-PREFIX...
    local i=$1
    shift
    netns_spawn "$i" "$tmp/mn$i.log" "$@" env SLURM_JOB_ID=f36ro SLURM_NNODES=2 SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-1]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x2)" \
        "$fsdpd" --job "$tmp/job.json" --checkpoint.dir="$mck" --checkpoint.interval_steps=1 \
        --checkpoint.async=true --train.max_steps=40 --runtime.workers_per_node=1 \
        --runtime.metrics="$tmp/mn$i.jsonl" --runtime.status_socket="$tmp/mn$i.sock" --output.dir="$tmp/mout"
}
node 0 env FSDP_FAULTS="step_delay=0:0.2"
p0=$NETNS_PID
node 1 unshare -m sh -c 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"' "$mck"
p1=$NETNS_PID
s0=0 s1=0
wait "$p0" || s0=$?
wait "$p1" || s1=$?
[ "$s0" -ne 0 ] || { cat "$tmp/mn0.log" "$tmp/mn1.log"; fail "two nodes: the job trained on with node 1 unable to save"; }
grep -qF "3 consecutive checkpoint saves failed" "$tmp/mn0.log" && grep -q "Read-only file system" "$tmp/mn0.log" ||
    { cat "$tmp/mn0.log" "$tmp/mn1.log"; fail "two nodes: the leader's stop does not name the error"; }
last=$(sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$tmp/mn0.jsonl" | tail -1)
[ "$last" -lt 30 ] || fail "two nodes: ran to step $last"
echo "two nodes, node 1 read-only: stopped after step $last (exit $s0 and $s1)"
echo ok
