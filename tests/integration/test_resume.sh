#!/usr/bin/env bash
# Resuming from a sharded checkpoint (F7).  6 steps straight vs 3 steps, a checkpoint, a crash
# after step 4, a resume for the rest: the same losses (all 17 digits) and the same final
# parameters, bit for bit, with the same worker count; resharded 2 -> 3 and 3 -> 1 workers:
# within 1e-5 relative.  A flipped byte, a truncated or missing file, another model's
# checkpoint, a missing latest or step-N: refused with the file named, no step runs.  A resume
# asking for another global_batch runs with the checkpoint's (logged).  After a save that was
# abandoned (and fsdpd killed), the job resumes from the checkpoint before it.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# run NAME CKPT_DIR WORKERS MICRO [FAULT ...] -- [overrides...]: sets $status; the final
# parameters go to $tmp/NAME.safetensors, the losses to $tmp/NAME.loss ("step loss" lines);
# each FAULT is an FSDP_FAULTS entry (base/fault.h).
run() {
    local name=$1 dir=$2 workers=$3 micro=$4
    shift 4
    local faults="final_params=$tmp/$name.safetensors"
    while [ "$1" != -- ]; do faults="$faults;$1"; shift; done
    shift
    status=0
    FSDP_FAULTS="$faults" "$fsdpd" \
        --job "$tmp/job.json" --runtime.metrics="$tmp/$name.jsonl" --checkpoint.dir="$dir" \
        --runtime.workers_per_node="$workers" --train.micro_batch="$micro" --train.max_steps=6 \
        --checkpoint.interval_steps=3 --checkpoint.async=false "$@" > "$tmp/$name.log" 2>&1 || status=$?
    touch "$tmp/$name.jsonl"
    sed -n 's/.*"step":\([0-9]*\),.*"loss":\([-0-9.e+]*\),.*/\1 \2/p' "$tmp/$name.jsonl" > "$tmp/$name.loss"
}
must_succeed() { [ "$status" -eq 0 ] || { cat "$tmp/$1.log"; fail "run $1 failed"; }; }
# crash_after_4 NAME DIR WORKERS MICRO: runs until rank 0 exits after step 4 (the checkpoint of
# step 3 committed).
crash_after_4() {
    run "$@" worker=0:exit:4 --
    [ "$status" -ne 0 ] || fail "run $1 should have crashed"
    [ "$(readlink "$2/latest")" = step-000003 ] || { cat "$tmp/$1.log"; fail "run $1: latest is not step-000003"; }
}
# same_losses A B TOL: B's steps have A's losses (TOL 0: the same 17-digit text).
same_losses() {
    join "$tmp/$1.loss" "$tmp/$2.loss" > "$tmp/joined"
    [ -s "$tmp/joined" ] || fail "no common steps in $1 and $2"
    awk -v tol="$3" -v a="$1" -v b="$2" '
        { d = $2 - $3; if (d < 0) d = -d; m = $3 < 0 ? -$3 : $3
          if ((tol == 0 && $2 != $3) || d > tol * m) { bad = 1; print "step " $1 ": " a " " $2 ", " b " " $3 } }
        END { exit bad }' "$tmp/joined" || fail "losses of $1 and $2 differ"
}

# --- the reference: 6 steps straight, 2 workers ----------------------------------------------
run straight "$tmp/ck0" 2 3 --
must_succeed straight
[ "$(wc -l < "$tmp/straight.loss")" -eq 6 ] || fail "expected 6 losses"

# --- 3 steps, checkpoint, crash, resume: bit for bit ------------------------------------------
crash_after_4 first "$tmp/ck" 2 3
same_losses straight first 0
cp -a "$tmp/ck" "$tmp/ck-copy"
run resumed "$tmp/ck" 2 3 -- --checkpoint.resume=auto
must_succeed resumed
grep -q "resuming from $tmp/ck/step-000003: step 3" "$tmp/resumed.log" || fail "did not resume from step 3"
[ "$(cut -d' ' -f1 "$tmp/resumed.loss" | tr '\n' ' ')" = "4 5 6 " ] || fail "the resumed run should run steps 4-6"
same_losses straight resumed 0
cmp -s "$tmp/straight.safetensors" "$tmp/resumed.safetensors" || fail "final parameters differ"
"$fsdpctl" compare "$tmp/straight.safetensors" "$tmp/resumed.safetensors" --rtol 0 > "$tmp/cmp.txt" \
    || { cat "$tmp/cmp.txt"; fail "fsdpctl compare --rtol 0 failed"; }
tokens() { tail -1 "$tmp/$1.jsonl" | sed -n 's/.*"tokens_seen":\([0-9]*\).*/\1/p'; }
[ "$(tokens straight)" = "$(tokens resumed)" ] || fail "tokens_seen differs: $(tokens straight) vs $(tokens resumed)"
echo "same workers: steps 4-6 bit-identical: $(cut -d' ' -f2 "$tmp/resumed.loss" | tr '\n' ' ')"
# Again from step 3 (F36: no silent loss): the committed step-000006 is moved aside to
# superseded/step-000006 (logged, byte for byte), the new one committed in its place.
cp -a "$tmp/ck/step-000006" "$tmp/step6-before"
run again "$tmp/ck" 2 3 -- --checkpoint.resume=step-3
must_succeed again
grep -qF "moved $tmp/ck/step-000006 to $tmp/ck/superseded/step-000006" "$tmp/again.log" ||
    { cat "$tmp/again.log"; fail "step 6 was not moved aside"; }
diff -r "$tmp/step6-before" "$tmp/ck/superseded/step-000006" || fail "the superseded step 6 changed"
grep -q "checkpoint $tmp/ck/step-000006 committed" "$tmp/again.log" || fail "step 6 was not committed again"
same_losses straight again 0
[ "$(ls "$tmp/ck" | tr '\n' ' ')" = "fsdpd.lock latest step-000003 step-000006 superseded " ] || fail "unexpected entries: $(ls "$tmp/ck")"
# keep = 2 never prunes superseded/: a third resume from step 3 moves the new step 6 beside it.
run again2 "$tmp/ck" 2 3 -- --checkpoint.resume=step-3 --checkpoint.keep=1
must_succeed again2
[ "$(ls "$tmp/ck/superseded" | tr '\n' ' ')" = "step-000006 step-000006.1 " ] ||
    fail "superseded/ holds: $(ls "$tmp/ck/superseded")"

# --- global_batch is the manifest's: a job asking for 6 resumes with the checkpoint's 12 -----
cp -a "$tmp/ck-copy" "$tmp/ckgb"
run gb "$tmp/ckgb" 2 3 -- --checkpoint.resume=latest --train.global_batch=6
must_succeed gb
grep -qF "train.global_batch is 12, from the checkpoint $tmp/ckgb/step-000003/manifest.json (the job says 6" \
    "$tmp/gb.log" || { cat "$tmp/gb.log"; fail "no log line says global_batch comes from the checkpoint"; }
same_losses straight gb 0
cmp -s "$tmp/straight.safetensors" "$tmp/gb.safetensors" || fail "global_batch 6 asked: final parameters differ"
grep -q '"global_batch": 12,' "$tmp/ckgb/step-000006/manifest.json" &&
    grep -q '"global_sample": 72,' "$tmp/ckgb/step-000006/manifest.json" ||
    fail "the resumed run's checkpoint does not keep global_batch 12"
echo "global_batch 6 asked on resume: the checkpoint's 12 used"

# --- resharding: 2 -> 3 workers, and 3 -> 1 ---------------------------------------------------
cp -a "$tmp/ck-copy" "$tmp/ck23"
run w2to3 "$tmp/ck23" 3 2 -- --checkpoint.resume=latest
must_succeed w2to3
same_losses straight w2to3 1e-5
"$fsdpctl" compare "$tmp/straight.safetensors" "$tmp/w2to3.safetensors" --rtol 1e-5 > "$tmp/cmp.txt" \
    || { cat "$tmp/cmp.txt"; fail "2 -> 3: final parameters differ"; }
crash_after_4 three "$tmp/ck31" 3 2
run w3to1 "$tmp/ck31" 1 12 -- --checkpoint.resume=step-3
must_succeed w3to1
grep -q "written by 3 ranks" "$tmp/w3to1.log" || fail "3 -> 1 did not read a 3-rank checkpoint"
same_losses straight w3to1 1e-5
"$fsdpctl" compare "$tmp/straight.safetensors" "$tmp/w3to1.safetensors" --rtol 1e-5 > "$tmp/cmp.txt" \
    || { cat "$tmp/cmp.txt"; fail "3 -> 1: final parameters differ"; }
echo "resharded 2 -> 3 and 3 -> 1: within 1e-5"

# --- refusals: nothing trains ---------------------------------------------------------------
# refused NAME DIR NEEDLE [overrides...]: the resume fails, naming NEEDLE, before any step.
refused() {
    local name=$1 dir=$2 needle=$3
    shift 3
    run "$name" "$dir" 2 3 -- --checkpoint.resume=latest "$@"
    [ "$status" -ne 0 ] || fail "$name: the job started"
    grep -qF -- "$needle" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no mention of '$needle'"; }
    [ ! -s "$tmp/$name.loss" ] || fail "$name: training steps ran"
}
shard=rank-00001-of-00002.bin
cp -a "$tmp/ck-copy" "$tmp/bad"
size=$(stat -c %s "$tmp/bad/step-000003/$shard")
printf '\x55' | dd of="$tmp/bad/step-000003/$shard" bs=1 seek=$((size / 2)) conv=notrunc status=none
refused flipped "$tmp/bad" "$shard: section"
grep -q "CRC32C mismatch" "$tmp/flipped.log" || fail "flipped: not reported as a CRC mismatch"
truncate -s $((size - 100)) "$tmp/bad/step-000003/$shard"
refused truncated "$tmp/bad" "$shard: $((size - 100)) bytes"
grep -q "truncated" "$tmp/truncated.log" || fail "truncated: not said"
! grep -q "started, pid" "$tmp/truncated.log" || fail "truncated: workers were started"
rm "$tmp/bad/step-000003/$shard"
refused missing "$tmp/bad" "$shard: missing"
make_small_model "$tmp/tied" true
refused othermodel "$tmp/ck-copy" "the checkpoint is of another model: tie_word_embeddings" \
    --model.config="$tmp/tied/model.json"
refused nolatest "$tmp/empty" "latest: no checkpoint to resume from"
refused nostep "$tmp/ck-copy" "step-000005: not a committed checkpoint" --checkpoint.resume=step-5
echo "corrupt, truncated, missing, other model, no checkpoint: refused"

# --- after an abandoned save: fsdpd killed, the resume uses the checkpoint before it ---------
FSDP_FAULTS=ckpt_write=1:stall:3 "$fsdpd" --job "$tmp/job.json" --checkpoint.dir="$tmp/ckab" \
    --train.max_steps=100000 --checkpoint.interval_steps=2 --checkpoint.timeout_s=1 \
    --runtime.metrics="$tmp/ab.jsonl" > "$tmp/ab.log" 2>&1 &
pid=$!
bg_pids+=("$pid")
wait_for 20 grep -qs "abandoned: rank 1" "$tmp/ab.log"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
ls "$tmp/ckab" | grep -q 'partial\.1$' || { cat "$tmp/ab.log"; fail "the abandoned save left no partial directory"; }
abandoned=$(sed -n 's/.*checkpoint of step \([0-9]*\) abandoned.*/\1/p' "$tmp/ab.log")
[ "$(readlink "$tmp/ckab/latest")" = step-000002 ] || fail "latest -> $(readlink "$tmp/ckab/latest")"
run afterab "$tmp/ckab" 2 3 -- --checkpoint.resume=auto
must_succeed afterab
grep -q "resuming from $tmp/ckab/step-000002: step 2" "$tmp/afterab.log" || { cat "$tmp/afterab.log"; fail "did not resume from step 2"; }
grep -q "removing .*partial.1, left by an earlier run" "$tmp/afterab.log" || fail "the partial directory was not removed"
[ "$(readlink "$tmp/ckab/latest")" = step-000006 ] || fail "the resumed run did not commit"
echo "after the save of step $abandoned was abandoned: resumed from step 2"
echo "ok"
