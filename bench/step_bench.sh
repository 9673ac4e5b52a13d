#!/usr/bin/env bash
# One H200, fsdpd beside the PyTorch FSDP2 peer (bench/peer_fsdp.py) in one call (F31): one
# table of tokens/s, step time, MFU, fsdpd / peer and the peak GPU memory of each run.
#
#   ROWS=a,b,c bench/step_bench.sh BUILD        (from the repository root; logs, table in $OUT)
#
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA.  Rows (seq 2048, one worker):
#   a  Llama 1.1B, 8 sequences a step, full activation checkpointing;
#   b  Llama-2-7B, 4, full recompute;
#   c  Llama-2-7B, 4: fsdpd with fsdp.activation_checkpointing=selective and =auto, the peer
#      with full recompute (it has no selective mode; row b's peer run when b ran too);
#   d  Llama-3-8B (llama3.1-8b.json; the peer's llama3-8b), D_BATCH (2) sequences, full
#      recompute: the fp32 state alone is 16 B a parameter = 120 GiB of the 139, and at 4 the
#      128256-wide fp32 logits (with their log-softmax and gradient in the peer's loss) leave
#      no margin on the peer's side;
#   e  Llama-2-7B, 2, no activation checkpointing on either side;
#   q  Qwen2.5-7B (qwen2.5-7b.json: q/k/v biases, vocabulary 152064; the peer's
#      Qwen2ForCausalLM, bench/peer_fsdp.py --model qwen2.5-7b), Q_BATCH (2) sequences, full
#      recompute (F43; not in the default rows).
# ROWS (default a,b,c,d,e) picks some: two calls of < 10 minutes are ROWS=a,b,c and
# ROWS=d,e.  STEPS (8) steps a run, the mean over those after the first 3 (the peer: --warm 3
# --steps STEPS-3).  Every run has a timeout, cut to what is left of BUDGET_S (560 s from the
# start, 20 s kept for the table); a run with less than 30 s left is skipped (counted).
# Memory, the same way on both sides: the largest process's peak in nvidia-smi
# --query-compute-apps, every 500 ms over the whole run (tests/gpu/lib.sh sample); beside it
# each side's own: fsdpd's context peak allocated (metrics' mem_peak_bytes), the peer's
# max_memory_allocated.  PROFILE=1: one more fsdpd run (PROFILE_ROW, default the first row
# run; 5 steps) under nsys, and the kernels taking the most GPU time a step
# (nsys stats cuda_gpu_kern_sum); without nsys a counted skip.  BACKEND=cpu tries the script
# on a machine without a GPU: the tiny model at seq SEQ (128), 2 sequences, the peer skipped
# (PEER=1 runs it all the same: tests/integration/test_step_bench.sh, with a stand-in torch).
# The last lines list what was skipped and failed; the exit status is 1 when anything failed.
set -u
build=${1:-build}
out=${OUT:-/tmp/fsdp-bench-out}
backend=${BACKEND:-cuda}
rows=${ROWS:-a,b,c,d,e}
steps=${STEPS:-8} warm=3
budget_end=$((SECONDS + ${BUDGET_S:-560}))
work=$(mktemp -d /tmp/fsdp-step-bench.XXXXXX)
mkdir -p "$out"
. tests/gpu/lib.sh
trap 'unsample; rm -rf "$work"' EXIT
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines (KINDS.md)
: > "$out/rows.tsv"
if [ "$backend" = cpu ]; then
    seq=${SEQ:-128}
    peer_note="the PyTorch peer is skipped (it needs CUDA)"
    [ "${PEER:-0}" = 1 ] && peer_note="PEER=1: the peer runs all the same"
    echo "BACKEND=cpu: every row on configs/models/tiny.json, 2 x $seq tokens a step; $peer_note"
else
    seq=2048
fi
[ "$steps" -gt "$warm" ] || { echo "step_bench.sh: STEPS must be more than $warm"; exit 1; }

# row_line ROW LABEL MODEL BATCH SIDE NAME WHAT STATUS: a line of $out/rows.tsv for the table.
row_line() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$seq" "$5" "$6" "$7" "$8" >> "$out/rows.tsv"; }

# ours ROW LABEL MODEL BATCH ACT LIMIT: fsdpd, fsdp.activation_checkpointing=ACT.
ours() {
    local row=$1 label=$2 model=$3 batch=$4 act=$5 name="$1_fsdpd_$5" lim status=failed
    lim=$(run_limit "$6")
    if [ "$lim" -lt 30 ]; then
        skipped "$name: ${lim}s left of BUDGET_S"
        row_line "$row" "$label" "$model" "$batch" fsdpd "$name" "activation_checkpointing=$act" "skipped (time)"
        return
    fi
    if SEQ=$seq WARM=$warm measured_run "$name" "$model" full 1 "$steps" "$batch" "$lim" \
        --fsdp.activation_checkpointing="$act"; then
        rate "$name" $((batch * seq)) 1
        grep -iE 'activation|recompute' "$out/$name.log" | grep -v '^step' | cut -c1-200 | head -2
        status=ran
    fi
    row_line "$row" "$label" "$model" "$batch" fsdpd "$name" "activation_checkpointing=$act" "$status"
}

peer_runs=() # "MODEL BATCH ACT=NAME ROW" of each peer run so far, for row c to reuse row b's
# peer ROW LABEL MODEL PEER_MODEL BATCH ACT LIMIT WHAT: bench/peer_fsdp.py on one GPU (ACT full
# or none), its figures in $out/NAME.fig as measured_run writes them.
peer() {
    local row=$1 label=$2 model=$3 peer_model=$4 batch=$5 act=$6 what=$8 name="$1_peer_$6" lim p
    if [ "$backend" = cpu ] && [ "${PEER:-0}" != 1 ]; then
        skipped "$name: the PyTorch peer needs CUDA (BACKEND=cpu)"
        row_line "$row" "$label" "$model" "$batch" peer "$name" "$what" "skipped (BACKEND=cpu)"
        return
    fi
    for p in "${peer_runs[@]+"${peer_runs[@]}"}"; do
        if [ "${p%% *}" = "$peer_model/$batch/$act" ]; then
            local same=${p#* }
            echo "the peer's run of row ${same%%_*} is this row's: $same"
            row_line "$row" "$label" "$model" "$batch" peer "$same" "$what" "reused: row ${same%%_*}'s run"
            return
        fi
    done
    lim=$(run_limit "$7")
    if [ "$lim" -lt 30 ]; then
        skipped "$name: ${lim}s left of BUDGET_S"
        row_line "$row" "$label" "$model" "$batch" peer "$name" "$what" "skipped (time)"
        return
    fi
    local flags=()
    [ "$act" = none ] && flags=(--no-ckpt)
    if peer_fsdp_run "$name" 1 "$lim" --model "$peer_model" --batch "$batch" --seq "$seq" \
        --steps $((steps - warm)) --warm "$warm" "${flags[@]+"${flags[@]}"}"; then
        peer_runs+=("$peer_model/$batch/$act $name")
        row_line "$row" "$label" "$model" "$batch" peer "$name" "$what" ran
    else
        failed "$name (the PyTorch peer): exit $?"
        row_line "$row" "$label" "$model" "$batch" peer "$name" "$what" failed
    fi
}

# bench_row ROW LABEL MODEL PEER_MODEL BATCH LIMIT PEER_ACT PEER_WHAT ACT...: a row, fsdpd once
# for each ACT, then the peer.
bench_row() {
    local row=$1 label=$2 model=$3 peer_model=$4 batch=$5 lim=$6 peer_act=$7 peer_what=$8 act
    shift 8
    [ "$backend" = cpu ] && label="$label (BACKEND=cpu: tiny.json)" model=configs/models/tiny.json batch=2 lim=120
    section "row $row: $label, $batch x $seq tokens a step"
    for act in "$@"; do ours "$row" "$label" "$model" "$batch" "$act" "$lim"; done
    peer "$row" "$label" "$model" "$peer_model" "$batch" "$peer_act" "$lim" "$peer_what"
}

section "device"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
    echo "no nvidia-smi: no GPU memory figures"
first_row=
for r in ${rows//,/ }; do
    case $r in
    a) bench_row a "Llama 1.1B" configs/models/llama-1.1b.json llama-1.1b 8 180 full "full recompute" full ;;
    b) bench_row b "Llama-2-7B" configs/models/llama2-7b.json llama2-7b 4 240 full "full recompute" full ;;
    c) bench_row c "Llama-2-7B" configs/models/llama2-7b.json llama2-7b 4 240 full \
           "full recompute (the peer has no selective mode)" selective auto ;;
    d) bench_row d "Llama-3-8B" configs/models/llama3.1-8b.json llama3-8b "${D_BATCH:-2}" 300 full "full recompute" full ;;
    e) bench_row e "Llama-2-7B, no recompute" configs/models/llama2-7b.json llama2-7b 2 240 none \
           "no activation checkpointing (--no-ckpt)" none ;;
    q) bench_row q "Qwen2.5-7B" configs/models/qwen2.5-7b.json qwen2.5-7b "${Q_BATCH:-2}" 300 full "full recompute" full ;;
    *) failed "unknown row '$r' (a, b, c, d, e, q)"; continue ;;
    esac
    first_row=${first_row:-$r}
done

# find_nsys: the nsys to run: $NSYS, the PATH's, or one in CUDA's or Nsight Systems' folders.
find_nsys() {
    local n
    for n in "${NSYS:-}" "$(command -v nsys)" /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys; do
        [ -n "$n" ] && [ -x "$n" ] && { echo "$n"; return 0; }
    done
    return 1
}
# profile: the first fsdpd run of PROFILE_ROW again, 5 steps, under nsys; its top kernels.
profile() {
    local row=${PROFILE_ROW:-$first_row} line model batch act lim rep
    line=$(awk -F '\t' -v r="$row" '$1 == r && $6 == "fsdpd" { print; exit }' "$out/rows.tsv")
    [ -n "$line" ] || { failed "PROFILE_ROW '$row': no fsdpd run of that row in this call"; return; }
    IFS=$'\t' read -r _ _ model batch _ _ _ act _ <<< "$line"
    act=${act#activation_checkpointing=}
    section "profile: row $row's fsdpd run (activation checkpointing $act) under nsys, 5 steps"
    local nsys
    nsys=$(find_nsys) || { skipped "profile: no nsys on this machine (PATH, NSYS, CUDA's and Nsight Systems' folders)"; return; }
    lim=$(run_limit 240)
    [ "$lim" -ge 60 ] || { skipped "profile: ${lim}s left of BUDGET_S"; return; }
    wrap=("$nsys" profile -t cuda -s none --cpuctxsw=none --force-overwrite=true -o "$work/profile")
    SEQ=$seq WARM=2 measured_run "profile_$row" "$model" full 1 5 "$batch" "$lim" \
        --fsdp.activation_checkpointing="$act" || { wrap=(); return; }
    wrap=()
    rep=$(ls "$work"/profile.nsys-rep "$work"/profile.qdrep 2>/dev/null | head -1)
    [ -n "$rep" ] || { failed "profile: nsys wrote no report"; return; }
    # cuda_gpu_kern_sum since nsys 2023; gpukernsum before.  Bounded too (at least 20 s).
    lim=$(run_limit 120)
    [ "$lim" -ge 20 ] || lim=20
    timeout "$lim" "$nsys" stats --report cuda_gpu_kern_sum --format csv --output - "$rep" > "$out/profile_kernels.csv" 2> "$out/profile_stats.log" ||
        timeout "$lim" "$nsys" stats --report gpukernsum --format csv --output - "$rep" > "$out/profile_kernels.csv" 2>> "$out/profile_stats.log"
    check "profile: the kernel table" python3 bench/step_table.py kernels "$out/profile_kernels.csv" 5 15
}
[ "${PROFILE:-0}" = 1 ] && [ -n "$first_row" ] && profile

section "table ($out/step_bench.md)"
check "table" python3 bench/step_table.py table "$out"
finish
