#!/usr/bin/env bash
# tests/gpu/*.sh run only on a GPU machine; what of them needs no GPU is checked here: they
# parse (bash -n), the helpers of tests/gpu/lib.sh on handmade metrics files (losses fails
# past its limit, on zero steps and on runs of different lengths; rate on no timed steps;
# job on a failed fsdpd, with BACKEND=cpu reaching it; skipped counted; gpu_peaks;
# measured_run's settings and figures on a fake fsdpd), and both scripts exit 1 when a step
# fails (fake fsdpd and fsdpctl that always fail).
source "$(dirname "$0")/lib.sh"

for s in tests/gpu/lib.sh tests/gpu/run_h200.sh tests/gpu/run_multi.sh tests/gpu/run_70b.sh tests/gpu/run_families.sh tests/gpu/run_long.sh \
    bench/plan_accuracy.sh bench/generate_bench.sh bench/long_context.sh; do
    bash -n "$s" || fail "$s does not parse"
done

mkdir -p "$tmp/out" "$tmp/work" "$tmp/fake"
# A fake fsdpd that writes its arguments to stdout (the job's log) and exits 3; fsdpctl fails.
printf '#!/bin/sh\necho "$@"\nexit 3\n' > "$tmp/fake/fsdpd"
printf '#!/bin/sh\necho "fake fsdpctl: $1 fails" >&2\nexit 1\n' > "$tmp/fake/fsdpctl"
chmod +x "$tmp/fake/fsdpd" "$tmp/fake/fsdpctl"

# gpu_lib SNIPPET: runs SNIPPET in bash -u (as the GPU scripts do) after sourcing
# tests/gpu/lib.sh; its output in $tmp/lib.out, its status returned.
gpu_lib() {
    local rc=0
    bash -uc "out='$tmp/out' work='$tmp/work' backend=cuda fsdpd='$tmp/fake/fsdpd'
              . tests/gpu/lib.sh
              $1" > "$tmp/lib.out" 2>&1 || rc=$?
    return $rc
}
metrics() { # NAME LOSS...: a metrics file with one step per loss, 0.5 s each
    local name=$1 step=0
    shift
    : > "$tmp/out/$name.jsonl"
    for l in "$@"; do
        step=$((step + 1))
        echo "{\"step\":$step,\"total_steps\":$#,\"loss\":$l,\"lr\":0.001,\"seconds\":0.5,\"rank\":0}" >> "$tmp/out/$name.jsonl"
    done
}
metrics a 10.5 9.25 8.0 7.5 7.0
metrics near 10.4 9.3 8.05 7.45 7.02  # within 2e-2 of a
metrics far 10.5 9.25 9.0 7.5 7.0     # step 3: 1/9 off
metrics short 10.5 9.25 8.0
metrics none

gpu_lib 'losses a near; finish' || { cat "$tmp/lib.out"; fail "losses within the limit failed"; }
grep -q "a vs near: 5 steps, .* (<= 2e-2)" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "losses: no report"; }
grep -q "nothing failed" "$tmp/lib.out" || fail "finish: no summary"
gpu_lib 'losses a a 0' || { cat "$tmp/lib.out"; fail "identical runs failed with limit 0"; }

expect_lib_failure() { # SNIPPET NEEDLE: SNIPPET then finish exits 1, its output holds NEEDLE
    local status=0
    gpu_lib "$1; finish" || status=$?
    [ "$status" -eq 1 ] || { cat "$tmp/lib.out"; fail "'$1' then finish exited $status, expected 1"; }
    grep -qF -- "$2" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "'$1': output does not mention '$2'"; }
    grep -q "^1 failed" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "'$1': no failure count"; }
}
expect_lib_failure 'losses a far' "FAILED: losses: a vs far: 5 steps, largest relative loss difference 1.11e-01 (> 2e-2)"
expect_lib_failure 'losses a near 1e-3' "(> 1e-3)"
expect_lib_failure 'losses none none' "none vs none: no steps to compare (0 and 0)"
expect_lib_failure 'losses a none' "a vs none: no steps to compare (5 and 0)"
expect_lib_failure 'losses missing a' "missing vs a: no steps to compare (0 and 5)"
expect_lib_failure 'losses a short' "a vs short: 3 steps, largest relative loss difference 0.00e+00 (<= 2e-2); the runs have 5 and 3 steps"
expect_lib_failure 'losses short a' "the runs have 3 and 5 steps"
expect_lib_failure 'rate short 640 1' "rate short: no timed steps"
expect_lib_failure 'check "a false step" false' "FAILED: a false step: exit 1"
gpu_lib 'rate a 640 1' || { cat "$tmp/lib.out"; fail "rate on 5 steps failed"; }
grep -qF "a: 0.5000 s/step over 2 steps = 1280 tokens/s" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "rate: wrong report"; }

# job: fsdpd's failure is counted; BACKEND=cpu in front of one job reaches its fsdpd.
expect_lib_failure 'job j1 2 --train.max_steps=3' "FAILED: job j1: exit 3"
grep -q -- "--runtime.backend=cuda --runtime.workers_per_node=2" "$tmp/out/j1.log" || fail "job: wrong arguments"
expect_lib_failure 'BACKEND=cpu job j2 2' "FAILED: job j2: exit 3"
grep -q -- "--runtime.backend=cpu " "$tmp/out/j2.log" || { cat "$tmp/out/j2.log"; fail "BACKEND=cpu did not reach the job"; }

# skipped: said at once, listed and counted by finish, not a failure.
gpu_lib 'skipped "profile: no nsys"; finish' || { cat "$tmp/lib.out"; fail "a skip alone failed"; }
grep -q "^SKIPPED: profile: no nsys" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "skipped: not said"; }
grep -q "^skipped: profile: no nsys" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "finish: the skip not listed"; }
grep -q "^nothing failed; 1 skipped$" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "finish: the skip not counted"; }
expect_lib_failure 'skipped s; false || failed f' "1 failed; 1 skipped"

# gpu_peaks: each process's peak from nvidia-smi --query-compute-apps samples, largest first.
printf '11, 100\n12, 50\n11, 300\nNo running processes found\n' > "$tmp/out/g.gpu"
gpu_lib 'gpu_peaks g; gpu_peaks missing' || { cat "$tmp/lib.out"; fail "gpu_peaks failed"; }
[ "$(cat "$tmp/lib.out")" = "$(printf '[300, 50]\n[]')" ] || { cat "$tmp/lib.out"; fail "gpu_peaks: wrong peaks"; }

# measured_run: SEQ, WARM, BACKEND and the wrap command reach the run; its figures file.
mkdir -p "$tmp/ok"
printf '#!/bin/sh\nexit 0\n' > "$tmp/ok/fsdpctl"
cat > "$tmp/ok/fsdpd" <<'SH'
#!/bin/sh
echo "wrapped=${WRAPPED:-no} $*"
for a; do case $a in --runtime.metrics=*) m=${a#*=} ;; esac; done
for s in 1 2 3 4; do echo "{\"step\":$s,\"loss\":5.0,\"seconds\":0.5,\"mem_peak_bytes\":1073741824,\"rank\":0}" >> "$m"; done
SH
chmod +x "$tmp/ok/fsdpd" "$tmp/ok/fsdpctl"
gpu_lib "build='$tmp/ok' wrap=(env WRAPPED=yes); SEQ=256 WARM=3 BACKEND=cpu measured_run m1 cfg full 1 4 2 10; cat \"\$out/m1.fig\"" ||
    { cat "$tmp/lib.out"; fail "measured_run on a fake fsdpd failed"; }
grep -qF "m1: 1024 tokens/s (0.50 s a step, 1 steps after the first 3)" "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "measured_run: wrong figures"; }
grep -qF '"tokens_per_s": 1024.0, "step_s": 0.5, "timed_steps": 1' "$tmp/lib.out" || { cat "$tmp/lib.out"; fail "measured_run: wrong figures file"; }
grep -q -- "^wrapped=yes .*--data.seq_len=256 .*--runtime.backend=cpu " "$tmp/out/m1.log" || { cat "$tmp/out/m1.log"; fail "measured_run: SEQ, BACKEND or wrap did not reach fsdpd"; }

# The scripts end non-zero when a step failed (here every step fails: fake fsdpd and fsdpctl).
mkdir -p "$tmp/carry"
status=0
OUT="$tmp/h200" SKIP_BIG=1 BACKEND=cpu timeout 60 bash tests/gpu/run_h200.sh "$tmp/fake" "$tmp/carry" \
    > "$tmp/h200.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || { cat "$tmp/h200.out"; fail "run_h200.sh exited $status with every step failing"; }
grep -q "^failed: golden: fsdpctl reference: exit 1" "$tmp/h200.out" || { cat "$tmp/h200.out"; fail "run_h200.sh: the failures are not listed"; }
grep -q "^failed: job tiny1: exit 3" "$tmp/h200.out" || { cat "$tmp/h200.out"; fail "run_h200.sh: the failed job is not listed"; }
status=0
OUT="$tmp/multi" GPUS=2 BACKEND=cpu timeout 60 bash tests/gpu/run_multi.sh "$tmp/fake" "$tmp/carry" correct \
    > "$tmp/multi.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || { cat "$tmp/multi.out"; fail "run_multi.sh exited $status with every step failing"; }
grep -q "^failed: losses: c1 vs cN: no steps to compare" "$tmp/multi.out" || { cat "$tmp/multi.out"; fail "run_multi.sh: the failed comparison is not listed"; }
status=0
OUT="$tmp/multi" GPUS=2 BACKEND=cpu timeout 60 bash tests/gpu/run_multi.sh "$tmp/fake" "$tmp/carry" corect \
    > "$tmp/multi.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || { cat "$tmp/multi.out"; fail "run_multi.sh exited $status on an unknown phase"; }
grep -q "unknown phase 'corect'" "$tmp/multi.out" || fail "run_multi.sh: the unknown phase is not named"

# The H200 build command tests/gpu/README.md gives (CUDA_ARCHS for sm_90 only) keeps the sm_90a
# rule of the Hopper attention, and gives every other kernel the caller's architectures.
archs=$(sed -n 's/.*make BUILD=build-h200 CUDA_ARCHS="\([^"]*\)".*/\1/p' tests/gpu/README.md)
[ -n "$archs" ] || fail "tests/gpu/README.md gives no H200 build command"
make -n BUILD="$tmp/b" CUDA=1 NVCC=nvcc CUDA_ARCHS="$archs" "$tmp/b/kernels/cuda/cuda_attention_sm90.cu.o" \
    "$tmp/b/kernels/cuda/cuda_linear.cu.o" > "$tmp/make.out" || fail "make -n of the H200 command failed"
grep "cuda_attention_sm90.cu " "$tmp/make.out" | grep -q -- "-gencode arch=compute_90a,code=sm_90a" &&
    ! grep "cuda_attention_sm90.cu " "$tmp/make.out" | grep -qF -- "$archs" ||
    { cat "$tmp/make.out"; fail "the H200 command builds cuda_attention_sm90.cu for $archs, not sm_90a"; }
grep "cuda_linear.cu " "$tmp/make.out" | grep -qF -- "$archs" || { cat "$tmp/make.out"; fail "CUDA_ARCHS did not reach the other kernels"; }
if command -v nvcc > /dev/null; then
    make BUILD="$tmp/b" CUDA_ARCHS="$archs" "$tmp/b/kernels/cuda/cuda_attention_sm90.cu.o" > "$tmp/nvcc.out" 2>&1 ||
        { cat "$tmp/nvcc.out"; fail "the H200 build command does not compile cuda_attention_sm90.cu"; }
fi

echo "tests/gpu scripts: helpers and exit status checked without a GPU"
