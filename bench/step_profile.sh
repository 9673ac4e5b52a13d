#!/usr/bin/env bash
# Where a Llama-2-7B step's GPU time goes, fsdpd beside the PyTorch FSDP2 peer in one call
# (F31): both run under the CUPTI kernel collector (bench/kernel_profile.c, injected with
# CUDA_INJECTION64_PATH, the way Nsight Systems attaches), which sums every kernel's GPU time
# per process; each side's table gives the kernels by category and the top ones, in ms a step
# (the kernel's share of the recorded span times the run's own step time).
#
#   bench/step_profile.sh BUILD        (from the repository root; tables and logs in $OUT)
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA.  ACT (full): both sides'
# activation checkpointing (full or none; none takes 2 sequences, as step_bench.sh's row e);
# TYPE (full): fsdpd's train.type; lora or qlora (r 64 on every linear, as bench/lora.sh)
# profile our side alone (the FSDP2 peer trains every weight: no peer for an adapter's table);
# STEPS (12) steps of each; fsdpd's kernels from its third step's metrics line on (the
# collector's KPROF_START_FILE, created then), the peer's after the first SKIP_S (14) seconds
# of each process's CUDA life (the model's loading and the first steps).  Needs CUPTI
# (kernel_profile.sh says where it looks) and a C compiler; the exit status is 1 when
# something failed.
set -u
build=${1:-build}
out=${OUT:-/tmp/fsdp-profile-out}
act=${ACT:-full} steps=${STEPS:-12} skip=${SKIP_S:-14} type=${TYPE:-full}
batch=4
[ "$act" = none ] && batch=2
work=$(mktemp -d /tmp/fsdp-step-profile.XXXXXX)
mkdir -p "$out"
. tests/gpu/lib.sh
trap 'unsample; rm -rf "$work"' EXIT
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines (KINDS.md)
lib=$(bash bench/kernel_profile.sh "$work") || { failed "no CUPTI collector"; finish; exit 1; }
collect() { echo CUDA_INJECTION64_PATH="$lib" KPROF_OUT="$work/$1" KPROF_SKIP_S="$skip"; }

section "fsdpd: Llama-2-7B $type, $batch x 2048 tokens, activation_checkpointing=$act, $steps steps, under CUPTI"
# The collector starts once three steps are done (a load of any length left out).
rm -f "$out/prof_fsdpd.jsonl"
touch_after_steps "$out/prof_fsdpd.jsonl" "$work/started"
wrap=(env $(collect fsdpd) KPROF_SKIP_S=0 KPROF_START_FILE="$work/started")
if SEQ=2048 WARM=3 measured_run prof_fsdpd configs/models/llama2-7b.json "$type" 1 "$steps" "$batch" 300 \
    --fsdp.activation_checkpointing="$act"; then
    step=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['step_s'])" "$out/prof_fsdpd.fig")
    check "fsdpd's kernel table" python3 bench/step_table.py cupti "$step" 25 "$work"/fsdpd.*.tsv
fi
unset wrap
kill "$starter" 2>/dev/null
if [ "$type" != full ]; then
    echo "no peer for train.type=$type (the FSDP2 peer trains every weight)"
    finish
    exit
fi

section "PyTorch FSDP2 (bench/peer_fsdp.py): the same, under CUPTI"
flags=()
[ "$act" = none ] && flags=(--no-ckpt)
if env $(collect peer) PYTHONUNBUFFERED=1 timeout 300 python3 -m torch.distributed.run --standalone \
    --nproc_per_node=1 bench/peer_fsdp.py --model llama2-7b --batch "$batch" --seq 2048 --steps "$steps" \
    --warm 3 "${flags[@]+"${flags[@]}"}" > "$out/prof_peer.log" 2>&1; then
    step=$(grep '^{' "$out/prof_peer.log" | tail -1 | python3 -c "import json, sys; print(json.load(sys.stdin)['step_s'])")
    check "the peer's kernel table" python3 bench/step_table.py cupti "$step" 25 "$work"/peer.*.tsv
else
    tail -5 "$out/prof_peer.log"
    failed "the peer under CUPTI"
fi
finish
