# Helpers of the whole-run GPU scripts (run_h200.sh, run_multi.sh); sourced, not run.
# Expects: $fsdpd, $out (logs), $work (scratch), $backend.

section() { echo; echo "=== $* ($(date +%T))"; }

# job NAME WORKERS [overrides...]: a fsdpd run of configs/jobs/tiny-cpu.json plus the
# overrides, its log in $out/NAME.log and its metrics in $out/NAME.jsonl.
job() {
    local name=$1 workers=$2
    shift 2
    rm -f "$out/$name.jsonl" # fsdpd appends to a metrics file
    timeout "${JOB_TIMEOUT:-300}" "$fsdpd" --job configs/jobs/tiny-cpu.json --runtime.backend="$backend" \
        --runtime.workers_per_node="$workers" --checkpoint.dir="$work/$name/ckpt" \
        --output.dir="$work/$name/out" --runtime.metrics="$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc; $(grep -c '"loss"' "$out/$name.jsonl" 2>/dev/null) steps;" \
         "first/last loss $(step_losses "$name" | sed -n '1p;$p' | tr '\n' ' ')"
    [ $rc -eq 0 ] || tail -5 "$out/$name.log"
    return $rc
}

# step_losses NAME: the loss of each step of a run, one a line.
step_losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$out/$1.jsonl" 2>/dev/null; }

# losses A B [LIMIT]: the largest relative difference of the per-step losses of two runs.
losses() {
    paste <(step_losses "$1") <(step_losses "$2") |
        awk -v a="$1" -v b="$2" -v lim="${3:-2e-2}" '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
            END { printf "%s vs %s: %d steps, largest relative loss difference %.2e (%s %s)\n", a, b, n, m, m <= lim ? "<=" : "> FAIL", lim }'
}

# rate NAME TOKENS_PER_STEP GPUS: mean step time after the first 3 steps, tokens/s in all
# and per GPU.
rate() {
    sed -n 's/.*"step":\([0-9]*\).*"seconds":\([0-9.e+-]*\).*/\1 \2/p' "$out/$1.jsonl" |
        awk -v name="$1" -v tok="$2" -v g="$3" 'NR > 3 { t += $2; n++ }
            END { if (n) printf "%s: %.4f s/step over %d steps = %.0f tokens/s, %.0f per GPU (%d GPUs)\n", name, t / n, n, tok / (t / n), tok / (t / n) / g, g }'
}

# mem NAME ... peak NAME: the most memory any GPU had in use meanwhile (nvidia-smi, MiB),
# sampled every 250 ms into $out/NAME_mem.txt.
mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$out/$1_mem.txt" 2>/dev/null & monitor=$!; }
peak() { kill "$monitor" 2>/dev/null; sort -n "$out/$1_mem.txt" 2>/dev/null | tail -1; }
