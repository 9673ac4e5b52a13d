#!/usr/bin/env bash
# F50: the FP8 all-gather of weights (train.fp8_all_gather, F45) beside bf16 gathers on the
# GPUs of one node, and beside PyTorch FSDP2 (bench/peer_fsdp.py: bf16, and torchao's float8
# with its FP8 all-gather when torchao imports), one call a GPU count:
#
#   GPUS="1 8" OUT=$OUT bash bench/fp8_gather_bench.sh BUILD [MODEL.json ...]
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; MODEL defaults to Llama-2-7B
# (llama3.1-8b.json: the peer's llama3-8b).  For each MODEL and each count G of GPUS (default
# "1 N", N every GPU nvidia-smi lists), a full fine-tune of a random base, BATCH (2) x SEQ (2048)
# tokens a GPU a step, full recompute, STEPS (50) steps, the first WARM (3) not timed:
#   - fsdpd with train.precision fp8, the FP8 layers' weights gathered in bf16
#     (train.fp8_all_gather false, "bf16g"), then as e4m3 codes ("fp8g"): tokens/s a GPU, the
#     bytes a rank sent into all-gathers a step (metrics' gathered_bytes), peak memory; the
#     losses of the two must be the same bits (the codes are the cast the bf16 gather does
#     after it: any difference fails);
#   - PROFILE=1 (the default on CUDA): each once more for PROFILE_STEPS (10) steps under the
#     CUPTI collector (bench/kernel_profile.c, from the third step on): NCCL's kernels' time a
#     step and the part of it no other kernel overlapped (exposed), the largest rank's;
#   - PEER=1 (the default on CUDA): peer_fsdp.py on G GPUs, bf16, then --float8 (a counted skip
#     without torchao).
# Then the table: each side's tokens/s a GPU, its scaling from the first count (tokens/s a GPU
# at G over that at GPUS' first), and fp8g over bf16g.  Every run has a timeout (RUN_S, 300 s);
# the exit status is 1 when anything failed.  BACKEND=cpu with configs/models/tiny.json
# (GPUS "1 2", SEQ 64, no profile, no peer) tries the script without a GPU.
set -u
build=${1:?usage: bench/fp8_gather_bench.sh BUILD [MODEL.json...]}
shift
[ $# -gt 0 ] || set -- configs/models/llama2-7b.json
out=${OUT:-/tmp/fsdp-fp8-gather} backend=${BACKEND:-cuda}
work=$(mktemp -d /tmp/fsdp-fp8-gather.XXXXXX)
mkdir -p "$out"
. tests/gpu/lib.sh
trap 'unsample; rm -rf "$work"' EXIT
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines (KINDS.md)
steps=${STEPS:-50} batch=${BATCH:-2} seq=${SEQ:-2048} warm=${WARM:-3} run_s=${RUN_S:-300}
profile=${PROFILE:-1} peer=${PEER:-1}
if [ "$backend" = cpu ]; then
    gpus=${GPUS:-1 2} profile=0 peer=0
else
    gpus=${GPUS:-1 $(nvidia-smi -L | wc -l)}
fi
[ "$steps" -gt "$warm" ] || { echo "fp8_gather_bench.sh: STEPS must be more than WARM"; exit 1; }
lib=
if [ "$profile" = 1 ]; then
    lib=$(bash bench/kernel_profile.sh "$work/kprof") || { skipped "the profile: no CUPTI collector"; profile=0; }
fi
: > "$out/runs.tsv"

# ours NAME MODEL G [overrides...]: fsdpd on G workers, FP8 compute; a line of runs.tsv.
ours() {
    local name=$1 model=$2 g=$3
    shift 3
    SEQ=$seq WARM=$warm measured_run "$name" "$model" full "$g" "$steps" "$batch" "$run_s" \
        --train.precision=fp8 "$@" || return 1
    local bytes
    bytes=$(tail -1 "$out/$name.jsonl" | sed -n 's/.*"gathered_bytes":\([0-9]*\).*/\1/p')
    grep -ho "their weights gathered [^;)]*" "$out/$name.log" | head -1
    printf '%s\t%s\t%s\tours\t%s\n' "$name" "$(basename "$model" .json)" "$g" "$((${bytes:-0} / steps))" >> "$out/runs.tsv"
}

# profiled NAME MODEL G [overrides...]: the same job for PROFILE_STEPS steps under the
# collector, started at the third step's metrics line; the largest rank's NCCL time a step,
# and its exposed part, into $out/NAME.comm.
profiled() {
    local name=$1 model=$2 g=$3
    shift 3
    rm -f "$out/$name.jsonl" "$work/started-$name"
    local starter
    touch_after_steps "$out/$name.jsonl" "$work/started-$name"
    wrap=(env CUDA_INJECTION64_PATH="$lib" KPROF_OUT="$work/kprof/$name" KPROF_START_FILE="$work/started-$name")
    SEQ=$seq WARM=3 measured_run "$name" "$model" full "$g" "${PROFILE_STEPS:-10}" "$batch" "$run_s" \
        --train.precision=fp8 "$@" > /dev/null
    local rc=$?
    wrap=()
    kill "$starter" 2>/dev/null
    [ $rc -eq 0 ] || return 1
    local step_s
    step_s=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["step_s"])' "$out/$name.fig") &&
        python3 bench/step_table.py comm "$step_s" "$work/kprof/$name".*.tsv > "$out/$name.comm" ||
        { failed "$name: no communication figures"; return 1; }
    echo "$name: NCCL $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.1f ms a step, exposed %.1f" % (d["comm_ms"], d["exposed_ms"]))' "$out/$name.comm")"
}

# peer NAME PEER_MODEL G [--float8]: peer_fsdp.py on G GPUs; a line of runs.tsv.
peer() {
    local name=$1 peer_model=$2 g=$3
    shift 3
    if peer_fsdp_run "$name" "$g" "$run_s" --model "$peer_model" --batch "$batch" --seq "$seq" \
        --steps $((steps - warm)) --warm "$warm" "$@"; then
        printf '%s\t%s\t%s\tpeer\t-\n' "$name" "$peer_model" "$g" >> "$out/runs.tsv"
    else
        failed "$name (the PyTorch peer): exit $?"
    fi
}

for model in "$@"; do
    m=$(basename "$model" .json)
    case $m in llama3.1-8b) peer_model=llama3-8b ;; *) peer_model=$m ;; esac
    for g in $gpus; do
        section "$m on $g GPU(s): FP8 compute, bf16 gathers then FP8 gathers, $batch x $seq tokens a GPU, $steps steps"
        ours "${m}_g${g}_bf16g" "$model" "$g" --train.fp8_all_gather=false &&
            ours "${m}_g${g}_fp8g" "$model" "$g" &&
            losses "${m}_g${g}_bf16g" "${m}_g${g}_fp8g" 0
        if [ "$profile" = 1 ] && [ "$g" -gt 1 ]; then
            profiled "${m}_g${g}_bf16g_prof" "$model" "$g" --train.fp8_all_gather=false
            profiled "${m}_g${g}_fp8g_prof" "$model" "$g"
        fi
        if [ "$peer" = 1 ]; then
            peer "${m}_g${g}_peer" "$peer_model" "$g"
            if python3 -c 'import torchao' 2> /dev/null; then
                peer "${m}_g${g}_peer_float8" "$peer_model" "$g" --float8
            else
                skipped "${m}_g${g}_peer_float8: torchao does not import here"
            fi
        fi
    done
done

section "table"
python3 - "$out" <<'PY' | tee "$out/fp8_gather.md" || failed "the table"
import json, os, sys
out = sys.argv[1]
runs = [l.rstrip("\n").split("\t") for l in open(f"{out}/runs.tsv") if l.strip()]
def fig(name):
    p = f"{out}/{name}.fig"
    return json.load(open(p)) if os.path.exists(p) else None
def comm(name):
    p = f"{out}/{name}_prof.comm"
    return json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else None
first = {}
print("| run | GPUs | tokens/s a GPU | s a step | scaling | gathered a rank a step | NCCL a step (exposed) | peak MiB a GPU | over bf16g |")
print("|---|---|---|---|---|---|---|---|---|")
for name, model, g, side, per_step in runs:
    f = fig(name)
    if not f:
        continue
    g = int(g)
    per_gpu = f["tokens_per_s"] / g if side == "ours" else f.get("tokens_per_s_per_gpu", f["tokens_per_s"] / g)
    kind = name.split(f"_g{g}_", 1)[1]
    first.setdefault((model, kind), (g, per_gpu))
    g0, base = first[(model, kind)]
    scaling = f"{per_gpu / base:.3f} (of {g0})" if g != g0 else "-"
    gathered = f"{int(per_step) / 2**20:.1f} MiB" if per_step != "-" else "-"
    c = comm(name)
    nccl = f"{c['comm_ms']:.1f} ms ({c['exposed_ms']:.1f})" if c else "-"
    ratio = "-"
    if kind == "fp8g":
        b = fig(name[: -len("fp8g")] + "bf16g")
        if b:
            ratio = f"{f['tokens_per_s'] / b['tokens_per_s']:.3f}x"
    peak = max(f.get("gpu_mib") or [0])
    print(f"| {name} | {g} | {per_gpu:.0f} | {f['step_s']:.3f} | {scaling} | {gathered} | {nccl} | {peak} | {ratio} |")
PY
finish
