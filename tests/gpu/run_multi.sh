#!/usr/bin/env bash
# F15: fsdpd on several GPUs of one node (NCCL), each run under a timeout, logs in $OUT.
# From the repository root, on a machine with 2 or more GPUs:
#
#   tests/gpu/run_multi.sh BUILD CARRY PHASE
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; CARRY holds peer_fsdp.py
# (bench/peer_fsdp.py, the PyTorch FSDP2 peer).  PHASE:
#   correct  the 1.1B model at sequence 2048 for 20 steps on 1 GPU and on N (same global
#            batch), N with overlap off (must give the same bits as with it on); checkpoints
#            written on N GPUs resumed on 1 and the reverse;
#   fault    a worker SIGKILLed mid-run: every rank stops, fsdpd restarts from `latest`;
#   scale    tokens/s per GPU of 7B (SCALE_MODEL) at 1 and N GPUs: full_shard with and without
#            overlap, no_shard; the PyTorch FSDP2 peer at 1 and N GPUs in the same call;
#   all      all three; or a comma-separated list ("correct,fault").
# N = GPUS (default: every GPU nvidia-smi lists).  SCALE_MODEL (configs/models/llama2-7b.json),
# SCALE_BATCH (4 sequences per GPU), SCALE_SEQ, SCALE_STEPS (10) change the scaling runs;
# SCALE_ACT (full; none: no activation checkpointing, for both sides); SKIP_ONE=1 leaves out
# their 1-GPU runs (a model that does not fit one GPU); SCALE_EXTRA=0 leaves out the runs
# without overlap and with no_shard; PEER=0 leaves out the PyTorch peer.  BACKEND=cpu with small models tries the
# script itself on a machine without GPUs (the peer is skipped there).  Every step runs even
# after one failed; the last lines list the failures, and the exit status is 1 when there was one.
set -u
build=${1:-build} carry=${2:-dev-carry} phase=${3:-all}
out=${OUT:-/tmp/fsdp-multi-out}
backend=${BACKEND:-cuda}
n=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "$n" -ge 2 ] || { echo "run_multi.sh: needs 2 or more GPUs (GPUS=$n)"; exit 1; }
big_model=${BIG_MODEL:-configs/models/llama-1.1b.json} big_seq=${BIG_SEQ:-2048}
scale_model=${SCALE_MODEL:-configs/models/llama2-7b.json} scale_seq=${SCALE_SEQ:-2048}
scale_batch=${SCALE_BATCH:-4} scale_steps=${SCALE_STEPS:-10} scale_act=${SCALE_ACT:-full}
work=$(mktemp -d /tmp/fsdp-multi.XXXXXX)
mkdir -p "$out"
fsdpd="$build/fsdpd" fsdpctl="$build/fsdpctl"
. tests/gpu/lib.sh
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines (KINDS.md)
one_gpu() { CUDA_VISIBLE_DEVICES=0 "$@"; }

section "device"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null
nvidia-smi topo -m 2>/dev/null | head -$((n + 2))

has() { [ "$phase" = all ] || [[ ",$phase," == *",$1,"* ]]; }
for p in ${phase//,/ }; do
    case $p in all | correct | fault | scale) ;; *) failed "unknown phase '$p' (correct, fault, scale, all)" ;; esac
done

if has correct; then
section "F15 correctness: $big_model, seq $big_seq, global batch 8, 20 steps: 1 GPU, $n GPUs, $n GPUs without overlap"
check "synth big.tokens" "$fsdpctl" synth --out "$work/big.tokens" --seq-len "$big_seq" --records 512 --alphabet 64 > /dev/null
big=(--model.init=random --model.config="$big_model" --data.path="$work/big.tokens" --data.seq_len="$big_seq"
     --train.global_batch=8 --train.micro_batch=$((8 / n)) --train.max_steps=20 --train.lr=3e-4
     --train.warmup_steps=2 --fsdp.activation_checkpointing=full --checkpoint.resume=never
     --checkpoint.save_final=false --output.consolidate=false --runtime.heartbeat_s=30)
one_gpu job c1 1 "${big[@]}"
job cN "$n" "${big[@]}"
job cN_sync "$n" "${big[@]}" --fsdp.forward_prefetch=false --fsdp.backward_prefetch=false
losses c1 cN
losses cN cN_sync 0
rate c1 $((8 * big_seq)) 1
rate cN $((8 * big_seq)) "$n"
rate cN_sync $((8 * big_seq)) "$n"

section "F15: a checkpoint of $n GPUs resumed on 1, and the reverse (tiny model, 20 steps, resumed at step 10)"
check "synth copy.tokens" "$fsdpctl" synth --out "$work/copy.tokens" --seq-len 32 --records 4096 > /dev/null
tiny=(--data.path="$work/copy.tokens" --train.max_steps=20 --output.consolidate=false)
one_gpu job straight 1 "${tiny[@]}" --checkpoint.resume=never --checkpoint.interval_steps=10
job nfull "$n" "${tiny[@]}" --checkpoint.resume=never --checkpoint.interval_steps=10
one_gpu job one_resume 1 "${tiny[@]}" --checkpoint.dir="$work/nfull/ckpt" --checkpoint.resume=step-10 &&
    resumed one_resume
job n_resume "$n" "${tiny[@]}" --checkpoint.dir="$work/straight/ckpt" --checkpoint.resume=step-10 &&
    resumed n_resume
{ head -10 "$out/nfull.jsonl"; cat "$out/one_resume.jsonl"; } > "$out/n_then_1.jsonl"
{ head -10 "$out/straight.jsonl"; cat "$out/n_resume.jsonl"; } > "$out/1_then_n.jsonl"
losses straight nfull
losses nfull n_then_1
losses straight 1_then_n

fi

if has fault; then
check "synth copy.tokens" "$fsdpctl" synth --out "$work/copy.tokens" --seq-len 32 --records 4096 > /dev/null
section "F15 faults: rank 1 of $n SIGKILLed mid-run; every rank stops, fsdpd restarts from latest"
fault=(--data.path="$work/copy.tokens" --output.consolidate=false --train.max_steps=1000 --checkpoint.interval_steps=100 --checkpoint.resume=never
       --runtime.max_restarts=1)
JOB_TIMEOUT=400 job fault "$n" "${fault[@]}" &
jobpid=$!
for _ in $(seq 600); do [ -e "$work/fault/ckpt/latest" ] && break; sleep 0.5; done
victim=$(sed -n 's/.*rank 1: started, pid \([0-9]*\).*/\1/p' "$out/fault.log" | head -1)
killed_at=$(date +%s.%N)
if [ -n "$victim" ] && kill -9 "$victim"; then
    echo "killed rank 1 (pid $victim) after $(readlink "$work/fault/ckpt/latest")"
else
    failed "fault: no rank 1 to kill (pid '$victim')"
fi
# job ran in a subshell: its failure is counted here
wait $jobpid || failed "job fault: exit $?"
restart_line=$(grep -m1 "restart 1 of 1" "$out/fault.log") || failed "fault: no restart logged"
echo "$restart_line"
resumed fault
echo "restart logged $(awk -v a="$killed_at" -v b="$(date -d "$(echo "$restart_line" | cut -d' ' -f1)" +%s.%N 2>/dev/null)" 'BEGIN { printf "%.1f", b - a }') s after the kill; $(grep -c '"loss"' "$out/fault.jsonl") step lines in all"
fi

if has scale; then
section "F15 scaling: $scale_model, seq $scale_seq, $scale_batch sequences per GPU, $scale_steps steps, activation checkpointing $scale_act"
check "synth scale.tokens" "$fsdpctl" synth --out "$work/scale.tokens" --seq-len "$scale_seq" --records 256 --alphabet 64 > /dev/null
scale=(--model.init=random --model.config="$scale_model" --data.path="$work/scale.tokens"
       --data.seq_len="$scale_seq" --train.micro_batch="$scale_batch" --train.max_steps="$scale_steps"
       --train.lr=1e-4 --train.min_lr=1e-5 --train.warmup_steps=2 --fsdp.activation_checkpointing="$scale_act"
       --checkpoint.resume=never --checkpoint.save_final=false --output.consolidate=false
       --runtime.heartbeat_s=60)
tok1=$((scale_batch * scale_seq)) tokN=$((n * scale_batch * scale_seq))
gpu_counts="1 $n"
[ -n "${SKIP_ONE:-}" ] && gpu_counts=$n # a model too big for one GPU
[ -n "${SKIP_ONE:-}" ] || { mem s1; JOB_TIMEOUT=300 one_gpu job s1 1 "${scale[@]}" --train.global_batch="$scale_batch"; echo "s1 peak $(peak s1) MiB"; }
mem sN; JOB_TIMEOUT=300 job sN "$n" "${scale[@]}" --train.global_batch=$((n * scale_batch)); echo "sN peak $(peak sN) MiB"
[ -n "${SKIP_ONE:-}" ] || rate s1 "$tok1" 1
rate sN "$tokN" "$n"
if [ "$backend" = cuda ] && [ -f "$carry/peer_fsdp.py" ] && [ "${PEER:-1}" = 1 ]; then
    section "PyTorch FSDP2 peer (fully_shard, bf16 params, fp32 reduce), same call"
    name=$(basename "$scale_model" .json) peer_act=
    [ "$scale_act" = none ] && peer_act=--no-ckpt
    for g in $gpu_counts; do
        PYTHONUNBUFFERED=1 timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node="$g" "$carry/peer_fsdp.py" \
            --model "$name" --batch "$scale_batch" --seq "$scale_seq" ${peer_act} > "$out/peer_fsdp_$g.log" 2>&1 ||
            failed "the PyTorch FSDP2 peer on $g GPUs: exit $?"
        grep '^{' "$out/peer_fsdp_$g.log" || tail -5 "$out/peer_fsdp_$g.log"
    done
fi
[ "${SCALE_EXTRA:-1}" = 0 ] || {
section "$scale_model on $n GPUs: without overlap, and no_shard"
JOB_TIMEOUT=300 job sN_sync "$n" "${scale[@]}" --train.global_batch=$((n * scale_batch)) \
    --fsdp.forward_prefetch=false --fsdp.backward_prefetch=false
mem sN_noshard; JOB_TIMEOUT=300 job sN_noshard "$n" "${scale[@]}" --train.global_batch=$((n * scale_batch)) \
    --fsdp.sharding=no_shard; echo "sN_noshard peak $(peak sN_noshard) MiB"
rate sN_sync "$tokN" "$n"; rate sN_noshard "$tokN" "$n"
}
fi
rm -rf "$work"
finish
