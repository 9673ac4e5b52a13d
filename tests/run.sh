#!/usr/bin/env bash
# Runs the test suite: every unit-test binary in BUILD/tests (cmocka; each case counted),
# then, for "all", every tests/integration/*.sh (each counted as one test; one that exits 77
# is skipped: its reason is printed, and it counts as neither).
# Ends with the line "N passed, N failed"; exits non-zero when anything failed.
set -u
build=${1:-build}
what=${2:-all}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2
case "$build" in /*) ;; *) build="$here/$build" ;; esac
export FSDP_BUILD="$build"
export FSDP_SHARED="${FSDP_SHARED:-$here/../shared}"
[ -d "$FSDP_SHARED/golden" ] || { echo "tests/run.sh: no golden data under $FSDP_SHARED (set FSDP_SHARED)"; exit 2; }
passed=0 failed=0 failures=() skipped=()

for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | sed -n 's/.*\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    f=$(printf '%s\n' "$out" | sed -n 's/.*\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    p=${p:-0} f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed before its summary
    passed=$((passed + p)) failed=$((failed + f))
    [ "$f" -eq 0 ] || failures+=("$t")
done

if [ "$what" = all ]; then
    for s in tests/integration/test_*.sh; do
        [ -f "$s" ] || continue
        echo "[ RUN      ] $s"
        start=$(date +%s)
        rc=0
        bash "$s" > "/tmp/fsdp-it-$$.log" 2>&1 || rc=$?
        if [ "$rc" -eq 0 ]; then
            echo "[       OK ] $s ($(( $(date +%s) - start )) s)"
            passed=$((passed + 1))
        elif [ "$rc" -eq 77 ]; then
            tail -5 "/tmp/fsdp-it-$$.log"
            echo "[ SKIPPED  ] $s"
            skipped+=("$s")
        else
            cat "/tmp/fsdp-it-$$.log"
            echo "[  FAILED  ] $s"
            failed=$((failed + 1)); failures+=("$s")
        fi
        rm -f "/tmp/fsdp-it-$$.log"
    done
fi

for f in "${skipped[@]+"${skipped[@]}"}"; do echo "skipped: $f"; done
for f in "${failures[@]+"${failures[@]}"}"; do echo "failed: $f"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
