# Helpers of the whole-run GPU scripts (run_h200.sh, run_multi.sh); sourced, not run.
# Expects: $fsdpd, $out (logs), $work (scratch), $backend.
# A script goes on after a failed step (the later ones still tell something) and ends with
# `finish`, which lists every failure and exits 1 when there was one.

section() { echo; echo "=== $* ($(date +%T))"; }

failures=() skips=()
exec 9>&1 # the script's stdout, for failed: a step's own output may be redirected to a log
# failed WHAT: records a failure (the script will exit 1) and says so at once.
failed() { failures+=("$*"); echo "FAILED: $*" >&9; }
# skipped WHAT: records a step left out (not a failure; finish counts it) and says so at once.
skipped() { skips+=("$*"); echo "SKIPPED: $*" >&9; }
# check WHAT CMD...: runs CMD; a non-zero exit is a failure of WHAT.  Returns CMD's status.
check() {
    local what=$1 rc=0
    shift
    "$@" || rc=$?
    [ "$rc" -eq 0 ] || failed "$what: exit $rc"
    return "$rc"
}
# finish: the summary, the steps skipped first; exits 1 when anything failed, else 0.
finish() {
    section "summary"
    [ "${#skips[@]}" -eq 0 ] || printf 'skipped: %s\n' "${skips[@]}"
    local skip_count=
    [ "${#skips[@]}" -eq 0 ] || skip_count="; ${#skips[@]} skipped"
    if [ "${#failures[@]}" -gt 0 ]; then
        printf 'failed: %s\n' "${failures[@]}"
        echo "${#failures[@]} failed$skip_count"
        exit 1
    fi
    echo "nothing failed$skip_count"
    exit 0
}

# run_limit WANT: WANT seconds, or what is left of the call's budget (until $budget_end, in
# bash SECONDS, less 20 s kept for the table), whichever is less (bench/step_bench.sh, dpo_bench.sh).
run_limit() {
    local left=$((budget_end - SECONDS - 20))
    if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# job NAME WORKERS [overrides...]: a fsdpd run of configs/jobs/tiny-cpu.json plus the
# overrides, its log in $out/NAME.log and its metrics in $out/NAME.jsonl.
job() {
    local name=$1 workers=$2
    shift 2
    rm -f "$out/$name.jsonl" # fsdpd appends to a metrics file
    # BACKEND=cpu job ... runs one job on the CPU backend (a prefix assignment reaches the
    # function through the environment; $backend is the script's).
    timeout "${JOB_TIMEOUT:-300}" "$fsdpd" --job configs/jobs/tiny-cpu.json --runtime.backend="${BACKEND:-$backend}" \
        --runtime.workers_per_node="$workers" --checkpoint.dir="$work/$name/ckpt" \
        --output.dir="$work/$name/out" --runtime.metrics="$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc; $(grep -c '"loss"' "$out/$name.jsonl" 2>/dev/null) steps;" \
         "first/last loss $(step_losses "$name" | sed -n '1p;$p' | tr '\n' ' ')"
    [ $rc -eq 0 ] || { tail -5 "$out/$name.log"; failed "job $name: exit $rc"; }
    return $rc
}

# resumed NAME: where the run's log says it resumed from; a failure when it does not say.
resumed() {
    grep -m1 -o "resum[a-z]* from [^ ]*.*" "$out/$1.log" 2>/dev/null || failed "$1: no 'resuming from' in its log"
}

# step_losses NAME: the loss of each step of a run, one a line.
step_losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$out/$1.jsonl" 2>/dev/null; }

# losses A B [LIMIT]: the largest relative difference of the per-step losses of two runs; a
# failure past LIMIT (default 2e-2), when either run has no steps, or when their step counts
# differ.
losses() {
    local lim=${3:-2e-2} report rc=0
    report=$(paste <(step_losses "$1") <(step_losses "$2") |
        awk -F '\t' -v a="$1" -v b="$2" -v lim="$lim" '
            $1 != "" { na++ }
            $2 != "" { nb++ }
            $1 == "" || $2 == "" { next }
            { den = $2 < 0 ? -$2 : $2; if (den < 1e-30) den = 1e-30
              d = ($1 - $2) / den; if (d < 0) d = -d; if (d > m) m = d; n++ }
            END { if (na == 0 || nb == 0) { printf "%s vs %s: no steps to compare (%d and %d)\n", a, b, na, nb; exit 1 }
                  printf "%s vs %s: %d steps, largest relative loss difference %.2e (%s %s)", a, b, n, m,
                         m <= lim ? "<=" : ">", lim
                  if (na != nb) printf "; the runs have %d and %d steps", na, nb
                  printf "\n"
                  exit m > lim || na != nb }') || rc=$?
    echo "$report"
    [ "$rc" -eq 0 ] || failed "losses: $report"
    return "$rc"
}

# rate NAME TOKENS_PER_STEP GPUS: mean step time after the first 3 steps, tokens/s in all
# and per GPU; a failure when the run has no step past the third.
rate() {
    sed -n 's/.*"step":\([0-9]*\).*"seconds":\([0-9.e+-]*\).*/\1 \2/p' "$out/$1.jsonl" 2>/dev/null |
        awk -v name="$1" -v tok="$2" -v g="$3" 'NR > 3 { t += $2; n++ }
            END { if (n && t > 0) printf "%s: %.4f s/step over %d steps = %.0f tokens/s, %.0f per GPU (%d GPUs)\n", name, t / n, n, tok / (t / n), tok / (t / n) / g, g
                  else exit 1 }' || failed "rate $1: no timed steps in $out/$1.jsonl"
}

# mem NAME ... peak NAME: the most memory any GPU had in use meanwhile (nvidia-smi, MiB),
# sampled every 250 ms into $out/NAME_mem.txt.
mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$out/$1_mem.txt" 2>/dev/null & monitor=$!; }
peak() { kill "$monitor" 2>/dev/null; sort -n "$out/$1_mem.txt" 2>/dev/null | tail -1; }

samplers=()

# sample NAME: GPU memory per process and host memory every 500 ms until unsample.
sample() {
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 500 \
        > "$out/$1.gpu" 2>/dev/null &
    samplers+=($!)
    (while :; do awk '/^MemTotal/ {t=$2} /^MemAvailable/ {a=$2} /^Shmem:/ {s=$2}
                      END {print t - a, s}' /proc/meminfo; sleep 0.5; done) > "$out/$1.host" &
    samplers+=($!)
}
unsample() {
    for p in "${samplers[@]+"${samplers[@]}"}"; do kill "$p" 2>/dev/null; done
    samplers=()
}
# gpu_peaks NAME: the peak GPU memory of each process sample NAME saw, MiB, largest first, as
# "[a, b]"; "[]" when it saw none (no nvidia-smi, or a CPU run).
gpu_peaks() {
    local v
    v=$(awk -F', *' 'NF == 2 && $2 ~ /^[0-9]+$/ { if ($2 + 0 > m[$1] + 0) m[$1] = $2 }
                     END { for (p in m) print m[p] }' "$out/$1.gpu" 2>/dev/null | sort -rn | paste -sd, -)
    echo "[${v//,/, }]"
}

# measured_run NAME MODEL TYPE WORKERS STEPS BATCH TIMEOUT [overrides...]: fsdpd training a
# random MODEL (TYPE full, lora or qlora: r 64, alpha 16 on every linear), BATCH sequences of
# SEQ tokens a worker a step, activation checkpointing (full; an override changes it), on
# synthetic tokens; prints a line of figures: tokens/s after the first WARM steps, the loss,
# fsdpd's peak allocated, nvidia-smi's peak per process, host RAM used (MemTotal -
# MemAvailable, less the idle machine's), and writes them to $out/NAME.fig (one JSON object).
# Expects $build, $out, $work.  Optional, set in front of the call as BACKEND is for job:
# SEQ (2048), WARM (2), BACKEND (cuda); and the array `wrap`, a command fsdpd runs under
# (e.g. nsys profile ...; empty by default).
measured_run() {
    local name=$1 model=$2 type=$3 workers=$4 steps=$5 batch=$6 limit=$7
    local seq=${SEQ:-2048} warm=${WARM:-2} run_backend=${BACKEND:-cuda}
    shift 7
    "$build/fsdpctl" synth --out "$work/data.tokens" --seq-len "$seq" --records $((batch * workers * (steps + 1))) \
        --vocab 32000 --alphabet 64 > /dev/null || { failed "$name: synth"; return 1; }
    local base_host
    base_host=$(awk '/^MemTotal/ {t=$2} /^MemAvailable/ {a=$2} END {print t - a}' /proc/meminfo)
    sample "$name"
    rm -f "$out/$name.jsonl" "$out/$name.fig"
    local adapter=() # lora.* only for an adapter job (with train.type full they are refused)
    [ "$type" = full ] || adapter=(--lora.rank=64 --lora.alpha=16 --lora.dropout=0 --lora.targets=all-linear)
    timeout "$limit" "${wrap[@]+"${wrap[@]}"}" "$build/fsdpd" --job configs/jobs/tiny-chat.json --model.path= --model.init=random \
        --model.config="$model" --model.dtype=bf16 --data.path="$work/data.tokens" --data.format=tokens \
        --data.template= --data.seq_len="$seq" --train.type="$type" "${adapter[@]}" --train.global_batch=$((batch * workers)) --train.micro_batch="$batch" \
        --train.max_steps="$steps" --train.warmup_steps=1 --train.lr=2e-4 --train.min_lr=0 \
        --fsdp.activation_checkpointing=full --runtime.backend="$run_backend" --runtime.workers_per_node="$workers" \
        --checkpoint.dir="$work/ckpt-$name" --checkpoint.resume=never --checkpoint.save_final=false \
        --output.consolidate=false --output.dir="$work/out-$name" --runtime.metrics="$out/$name.jsonl" \
        --runtime.heartbeat_s=30 --runtime.comm_timeout_s=600 "$@" > "$out/$name.log" 2>&1
    local rc=$?
    unsample
    [ $rc -eq 0 ] || { grep -v '^step' "$out/$name.log" | tail -8; failed "$name: exit $rc"; return 1; }
    grep -E 'quantized|memory|offload' "$out/$name.log" | grep -v '^step' | cut -c1-220 | head -4
    python3 - "$name" "$out" "$batch" "$workers" "$base_host" "$seq" "$warm" "$(gpu_peaks "$name")" <<'PY' ||
import json, sys
name, out, batch, workers, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
seq, warm, gpu = int(sys.argv[6]), int(sys.argv[7]), json.loads(sys.argv[8])
rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
steady = rows[warm:] or rows[1:]
sec = sum(r["seconds"] for r in steady)
tok = batch * workers * seq * len(steady)
host = [tuple(map(int, l.split())) for l in open(f"{out}/{name}.host") if l.strip()]
used = max(h[0] for h in host) - base
shm = max(h[1] for h in host)
peak = max(r['mem_peak_bytes'] for r in rows)
print(f"{name}: {tok / sec:.0f} tokens/s ({sec / len(steady):.2f} s a step, {len(steady)} steps after the first "
      f"{len(rows) - len(steady)}), loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, peak allocated "
      f"{peak / 2**30:.1f} GiB (rank 0), GPU per process "
      f"{gpu} MiB, host RAM used +{used / 2**20:.1f} GiB "
      f"(shared memory {shm / 2**20:.1f} GiB)")
json.dump(dict(tokens_per_s=tok / sec, step_s=sec / len(steady), timed_steps=len(steady), gpu_mib=gpu,
               own_peak_gib=peak / 2**30, loss=rows[-1]["loss"]), open(f"{out}/{name}.fig", "w"))
PY
        { failed "$name: no figures from $out/$name.jsonl"; return 1; }
}

# peer_fsdp_run NAME GPUS LIMIT [peer_fsdp.py args...]: bench/peer_fsdp.py (PyTorch FSDP2) on
# GPUS processes under LIMIT seconds, its log in $out/NAME.log and, when it ran, its figures
# with nvidia-smi's peaks in $out/NAME.fig (step_table.py peer-fig: measured_run's keys);
# prints its JSON line.  Returns non-zero, with the log's tail printed, when it failed (the
# caller counts it).  Expects $out.
peer_fsdp_run() {
    local name=$1 gpus=$2 limit=$3 rc=0
    shift 3
    rm -f "$out/$name.fig"
    sample "$name"
    PYTHONUNBUFFERED=1 timeout "$limit" python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" \
        bench/peer_fsdp.py "$@" > "$out/$name.log" 2>&1 || rc=$?
    unsample
    if [ "$rc" -eq 0 ] && python3 bench/step_table.py peer-fig "$out/$name.log" "$(gpu_peaks "$name")" > "$out/$name.fig"; then
        grep '^{' "$out/$name.log" | tail -1
        return 0
    fi
    tail -5 "$out/$name.log"
    return "$(( rc ? rc : 1 ))"
}

# touch_after_steps JSONL FILE: in the background, creates FILE once the metrics file JSONL has
# three step lines (the CUPTI collector's KPROF_START_FILE: a load of any length left out of
# the table); its pid in $starter, for the caller to kill after the run.
touch_after_steps() {
    (until [ "$({ wc -l < "$1"; } 2>/dev/null || echo 0)" -ge 3 ]; do sleep 0.2; done
     touch "$2") &
    starter=$!
}
