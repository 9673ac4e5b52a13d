#!/usr/bin/env bash
# fsdpd as a node daemon (F11): one shared-memory copy of the model for all workers (summed
# Pss of fsdpd and 3 workers within the model bytes + the workers' own state + 10%; each
# worker's private memory within its own state: no copy of the model, read() or mapped);
# a worker SIGKILLed mid-run with
# max_restarts 1: the job restarts from the last checkpoint, says from which step, and ends
# with the parameters of a run without the kill; SIGKILL to fsdpd: every worker and the
# shared memory are gone within 5 s; SIGUSR1 to every process of the job (as SLURM sends
# it): a checkpoint appears and training goes on; SIGTERM to every process: a clean stop
# after a checkpoint.
source "$(dirname "$0")/lib.sh"

make_small_data "$tmp/data.tokens" 600
# A model of ~100 MB in fp32 (vocab 8000 x hidden 512 embeddings and head, 4 layers).
cat > "$tmp/model.json" <<JSON
{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
 "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
JSON
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"

# start NAME [overrides...]: fsdpd in the background; sets $pid.
start() {
    local name=$1
    shift
    "$fsdpd" --job "$tmp/job.json" --runtime.metrics="$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 &
    pid=$!
    bg_pids+=("$pid")
}
finish() { # NAME: waits for $pid; sets $status
    status=0
    wait_for 60 sh -c "! kill -0 $pid 2>/dev/null"
    wait "$pid" || status=$?
}
job_pids() { echo "$pid" $(worker_pids "$tmp/$1.log"); }
# memfd_holders NAME: how many processes, of any kind, hold the memfd NAME (a descriptor or
# a mapping).
memfd_holders() {
    local d n=0
    for d in /proc/[0-9]*; do
        if ls -l "$d/fd" 2>/dev/null | grep -qF "memfd:$1 " || grep -qF "memfd:$1 " "$d/maps" 2>/dev/null; then
            n=$((n + 1))
        fi
    done
    echo "$n"
}
no_memfd_holder() { [ "$(memfd_holders "$1")" -eq 0 ]; }

# --- one copy of the model for the node ------------------------------------------------------
start pss --runtime.workers_per_node=3 --train.global_batch=3 --train.micro_batch=1 \
    --train.max_steps=1000 --checkpoint.resume=never --checkpoint.dir="$tmp/pss-ckpt"
wait_for 60 grep -qs "step 2/" "$tmp/pss.log"
model_mb=$(sed -n 's/.*model in shared memory: \([0-9.]*\) MB.*/\1/p' "$tmp/pss.log")
pss_kb=0
# Anonymous and shared-memory pages only: a private copy of the model would be one or the
# other, while the shared libraries' code (the CUDA libraries' in a CUDA build) is not the job's.
for p in $(job_pids pss); do
    pss_kb=$((pss_kb + $(awk '/^Pss_(Anon|Shmem):/ { n += $2 } END { print n }' "/proc/$p/smaps_rollup")))
done
# Each worker's own state: fp32 master, m, v and gradient shards (16 bytes a parameter over
# the 3 workers in all) plus its gathered unit and unit gradient (the largest unit is the
# embedding, 8000 x 512, in fp32, twice) and activations: ~70 MB a worker here.  And every
# process's fixed cost, measured on an idle worker (libraries loaded, waiting for its
# CONFIG): in a CUDA build cuBLASLt's static data alone is ~80 MB a process.
read -r idle_kb idle_private_kb < <(python3 - "$build/fsdp-worker" <<'PY'
import socket, subprocess, sys, time
a, b = socket.socketpair()
w = subprocess.Popen([sys.argv[1], "--ctl-fd", str(b.fileno())], pass_fds=[b.fileno()])
time.sleep(1.5)
def kb(*keys):
    return sum(int(l.split()[1]) for l in open("/proc/%d/smaps_rollup" % w.pid) if l.startswith(keys))
print(kb("Pss_Anon:", "Pss_Shmem:"), kb("Private_Clean:", "Private_Dirty:"))
w.kill(); w.wait()
PY
)
params=$(awk -v mb="$model_mb" 'BEGIN { printf "%d", mb * 1e6 / 4 }')
allowed_kb=$(awk -v mb="$model_mb" -v n="$params" -v idle="$idle_kb" \
    'BEGIN { printf "%d", (mb * 1e6 + 16 * n + 3 * 70e6) * 1.10 / 1024 + 4 * idle }')
echo "model ${model_mb} MB; summed Pss $((pss_kb / 1024)) MB; allowed $((allowed_kb / 1024)) MB (idle process $((idle_kb / 1024)) MB)"
[ "$pss_kb" -le "$allowed_kb" ] || fail "summed Pss ${pss_kb} kB exceeds ${allowed_kb} kB"
# Each worker's private pages (anonymous, or private copies of mapped pages) within its own
# state — 1/3 of 28 bytes a parameter: fp32 master, m, v and gradient, and the checkpoint
# image of master, m and v — and an idle worker's, plus half the model (the gathered unit and
# activations: ~35 MB here), so that a private copy of the whole model, made with read() or
# from a mapping (which rchar would not see), stands out.
own_kb=$(awk -v n="$params" -v mb="$model_mb" -v idle="$idle_private_kb" \
    'BEGIN { printf "%d", (28 * n / 3 + mb * 1e6 / 2) / 1024 + idle }')
for p in $(worker_pids "$tmp/pss.log"); do
    private_kb=$(awk '/^Private_(Clean|Dirty):/ { n += $2 } END { print n }' "/proc/$p/smaps_rollup")
    echo "worker $p: private $((private_kb / 1024)) MB, allowed $((own_kb / 1024)) MB"
    [ "$private_kb" -le "$own_kb" ] || fail "worker $p has ${private_kb} kB of private memory, more than its own state (${own_kb} kB): a copy of the model?"
done
memfd=$(ls -l "/proc/$pid/fd" | sed -n 's/.*memfd:\(fsdpd-model[^ ]*\).*/\1/p' | head -1)
[ -n "$memfd" ] || fail "fsdpd holds no memfd:fsdpd-model-*"
[ "$(memfd_holders "$memfd")" -ge 1 ] || fail "memfd:$memfd: no holder found"

# --- SIGKILL to fsdpd: workers and the shared memory go with it -----------------------------
victims=$(job_pids pss)
kill -9 "$pid"
gone() { for p in $victims; do kill -0 "$p" 2>/dev/null && return 1; done; return 0; }
wait_for 5 gone
wait_for 5 no_memfd_holder "$memfd"
wait "$pid" 2>/dev/null || true

# --- a worker killed mid-run: restart from the last checkpoint, same result -----------------
FSDP_FAULTS=final_params="$tmp/straight.safetensors" "$fsdpd" --job "$tmp/job.json" \
    --train.max_steps=8 --checkpoint.interval_steps=2 --checkpoint.resume=never \
    --checkpoint.dir="$tmp/straight-ckpt" > "$tmp/straight.log" 2>&1 || { cat "$tmp/straight.log"; fail "straight run"; }
# step_delay keeps step-000004 on disk long enough to be seen (checkpoint.keep 2 prunes it once
# step 8 commits); a run that ends first is a failure that shows its log, not a 180 s wait.
FSDP_FAULTS="final_params=$tmp/restarted.safetensors;step_delay=1:0.3" "$fsdpd" --job "$tmp/job.json" \
    --train.max_steps=8 --checkpoint.interval_steps=2 --checkpoint.resume=never \
    --checkpoint.dir="$tmp/restart-ckpt" --runtime.max_restarts=1 --runtime.metrics="$tmp/restarted.jsonl" \
    > "$tmp/restarted.log" 2>&1 &
pid=$!
bg_pids+=("$pid")
step4_or_exit() { [ -d "$tmp/restart-ckpt/step-000004" ] || ! kill -0 "$pid" 2>/dev/null; }
wait_for 180 step4_or_exit
kill -0 "$pid" 2>/dev/null || { cat "$tmp/restarted.log"; fail "the run ended before a worker could be killed after step 4"; }
kill -9 $(worker_pids "$tmp/restarted.log" | tail -1)
finish restarted
[ "$status" -eq 0 ] || { cat "$tmp/restarted.log"; fail "the restarted run failed"; }
grep -q "restart 1 of 1 after: rank 1 was killed by signal 9" "$tmp/restarted.log" || { cat "$tmp/restarted.log"; fail "no restart logged"; }
# (max_restarts turns in-memory checkpoints on: the restart resumes from memory, which says its step too)
grep -qE "resuming from .*(step-0000[0-9]*|memory-manifest.json): step [0-9]*" "$tmp/restarted.log" ||
    { cat "$tmp/restarted.log"; fail "the restart does not say from which step"; }
cmp "$tmp/straight.safetensors" "$tmp/restarted.safetensors" || fail "the restarted run ends with other parameters"
# A fault that fires again after the restart, with no restarts left: the job fails.
status=0
FSDP_FAULTS=worker=1:exit:3 "$fsdpd" --job "$tmp/job.json" --train.max_steps=8 \
    --checkpoint.interval_steps=2 --checkpoint.resume=never --checkpoint.dir="$tmp/fail-ckpt" \
    --runtime.max_restarts=1 > "$tmp/fail.log" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "job failed after its restarts" "$tmp/fail.log" || { cat "$tmp/fail.log"; fail "max_restarts not enforced"; }

# --- SIGUSR1 to every process: a checkpoint, and training goes on ----------------------------
# stop_grace_s covers the step in progress and the synchronous save of SIGTERM on a busy machine.
start usr1 --train.max_steps=100000 --checkpoint.resume=never --checkpoint.dir="$tmp/usr1-ckpt" \
    --runtime.stop_grace_s=30
wait_for 30 grep -qs "step 3/" "$tmp/usr1.log"
kill -USR1 $(job_pids usr1)
wait_for 20 sh -c "ls '$tmp/usr1-ckpt' 2>/dev/null | grep -q '^step-[0-9]*$'"
step_then=$(tail -1 "$tmp/usr1.jsonl" | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
wait_for 20 sh -c "[ \$(tail -1 '$tmp/usr1.jsonl' | sed -n 's/.*\"step\":\([0-9]*\).*/\1/p') -gt $((step_then + 2)) ]"
kill -0 "$pid" || fail "fsdpd did not survive SIGUSR1"
for p in $(worker_pids "$tmp/usr1.log"); do kill -0 "$p" || fail "a worker died of SIGUSR1"; done

# --- SIGTERM to every process: checkpoint, then a clean stop ---------------------------------
before=$(ls "$tmp/usr1-ckpt" | grep -c '^step-[0-9]*$')
kill -TERM $(job_pids usr1)
finish usr1
[ "$status" -eq 1 ] || { cat "$tmp/usr1.log"; fail "fsdpd exited $status after SIGTERM (expected 1)"; }
grep -q "stopped by signal SIGTERM" "$tmp/usr1.log" || fail "no reason given"
after=$(ls "$tmp/usr1-ckpt" | grep -c '^step-[0-9]*$')
[ "$after" -gt "$before" ] || { ls "$tmp/usr1-ckpt"; cat "$tmp/usr1.log"; fail "no checkpoint at SIGTERM"; }
! ls "$tmp/usr1-ckpt" | grep -q partial || fail "partial checkpoint left"
assert_gone $(worker_pids "$tmp/usr1.log")
echo ok
