#!/usr/bin/env bash
# In-memory checkpoints (F48, daemon/memory_ckpt.h), one node of 2 CPU workers, a disk
# checkpoint every 10 steps, runtime.max_restarts=1 (memory checkpoints on by it):
# - rank 1 killed (-9) at step 15 or later: the restart resumes from the in-memory checkpoint of
#   a step past `latest` (step 10), and the job ends with the bits of an uninterrupted run;
# - the same with checkpoint.memory_interval_steps=0: from `latest` (step 10), the same bits;
# - rank 1's two images broken (their magic zeroed through fsdpd's descriptors) before the
#   kill: not whole on this node, so from `latest`: the same bits;
# - a LoRA job: the adapters' images, the same;
# - nothing of fsdpd's in /dev/shm (its images are memory files of its own).
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--train.max_steps=40 --checkpoint.interval_steps=10 --output.consolidate=false)
slow="step_delay=0:0.05" # slow enough to kill mid-training (the bits are unchanged)

# reference NAME ARGS...: uninterrupted; its final parameters in $tmp/NAME.ref.safetensors.
reference() {
    local name=$1
    shift
    FSDP_FAULTS="$slow;final_params=$tmp/$name.ref.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --checkpoint.dir="$tmp/$name.ref.ckpt" --output.dir="$tmp/$name.ref.out" "$@" > "$tmp/$name.ref.log" 2>&1 ||
        { cat "$tmp/$name.ref.log"; fail "$name: the uninterrupted run failed"; }
}
# killed NAME BREAK ARGS...: rank 1 killed once step 15 is reported (its images broken first
# when BREAK is "break"); the job must end 0.
killed() {
    local name=$1 brk=${2:-} status=0
    shift 2
    FSDP_FAULTS="$slow;final_params=$tmp/$name.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --checkpoint.dir="$tmp/$name.ckpt" --output.dir="$tmp/$name.out" --runtime.max_restarts=1 "$@" \
        > "$tmp/$name.log" 2>&1 &
    local pid=$!
    bg_pids+=("$pid")
    wait_for 60 grep -q '"step":15,' "$tmp/$name.out/metrics.jsonl"
    local victim
    victim=$(worker_pids "$tmp/$name.log" | sed -n 2p)
    if [ "$brk" = break ]; then
        # stopped first, so that no save of its own rewrites an image between the break and
        # the kill (saves come every step: on a loaded machine two could land in that time)
        kill -STOP "$victim"
        local fd
        for fd in $(ls -l "/proc/$pid/fd" | sed -n 's/.* \([0-9]*\) -> .memfd:fsdpd-ckpt-w1\..*/\1/p'); do
            printf '\0\0\0\0\0\0\0\0' | dd of="/proc/$pid/fd/$fd" bs=8 count=1 conv=notrunc status=none
        done
    fi
    kill -KILL "$victim"
    wait "$pid" || status=$?
    [ "$status" -eq 0 ] || { cat "$tmp/$name.log"; fail "$name: exited $status"; }
    grep -q "restart 1 of 1 after: rank 1 was killed by signal 9" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no restart"; }
}
# memory_step LOG: the step a resume from memory started from ("" for none).
memory_step() { sed -n 's/.*resuming from the in-memory checkpoint of step \([0-9]*\), .*/\1/p' "$1" | tail -n 1; }

reference full
killed mem ""
step=$(memory_step "$tmp/mem.log")
[ -n "$step" ] && [ "$step" -gt 10 ] || { cat "$tmp/mem.log"; fail "mem: not resumed from memory past step 10 (step '$step')"; }
grep -q "in-memory checkpoints: 2 images a rank" "$tmp/mem.log" || { cat "$tmp/mem.log"; fail "mem: the images are not said"; }
grep -q "latest on disk: step 10)" "$tmp/mem.log" || { cat "$tmp/mem.log"; fail "mem: the disk's latest is not said"; }
cmp "$tmp/full.ref.safetensors" "$tmp/mem.safetensors" || fail "mem: the final parameters differ from an uninterrupted run's"
[ ! -e "$tmp/mem.ckpt/memory-manifest.json" ] || fail "mem: the memory manifest outlived the job"
echo "mem: rank 1 killed, resumed from memory at step $step (disk: 10), the bits of an uninterrupted run"

killed disk "" --checkpoint.memory_interval_steps=0
[ -z "$(memory_step "$tmp/disk.log")" ] || fail "disk: resumed from memory with memory checkpoints off"
grep -q "resuming from .*step-000010" "$tmp/disk.log" || { cat "$tmp/disk.log"; fail "disk: not resumed from step 10"; }
! grep -q "in-memory checkpoint" "$tmp/disk.log" || fail "disk: memory checkpoints with checkpoint.memory_interval_steps=0"
cmp "$tmp/full.ref.safetensors" "$tmp/disk.safetensors" || fail "disk: the final parameters differ"

killed broken break
[ -z "$(memory_step "$tmp/broken.log")" ] || { cat "$tmp/broken.log"; fail "broken: resumed from broken images"; }
grep -q "no in-memory checkpoint to resume on this node: the in-memory checkpoint of step [0-9]*: the image of rank-00001-of-00002.bin" \
    "$tmp/broken.log" || { cat "$tmp/broken.log"; fail "broken: the broken image is not named"; }
grep -q "resuming from .*step-000010" "$tmp/broken.log" || { cat "$tmp/broken.log"; fail "broken: not resumed from disk"; }
cmp "$tmp/full.ref.safetensors" "$tmp/broken.safetensors" || fail "broken: the final parameters differ"
echo "disk, broken: from step 10 on disk, the same bits"

lora=(--train.type=lora --lora.rank=4 --lora.alpha=8 --lora.targets=all-linear)
reference lora "${lora[@]}"
killed lora "" "${lora[@]}"
[ -n "$(memory_step "$tmp/lora.log")" ] || { cat "$tmp/lora.log"; fail "lora: not resumed from memory"; }
cmp "$tmp/lora.ref.safetensors" "$tmp/lora.safetensors" || fail "lora: the final parameters differ"

[ -z "$(ls /dev/shm | grep fsdp)" ] || fail "shared memory left in /dev/shm: $(ls /dev/shm | grep fsdp)"
echo "memory_ckpt: ok"
