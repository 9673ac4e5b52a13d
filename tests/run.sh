#!/usr/bin/env bash
# tests/run.sh BUILD [unit|integration|all] [NAME...]
# Runs the test suite: every unit-test binary in BUILD/tests (cmocka; each case counted;
# "unit" and "all"), then every tests/integration/test_*.sh (each counted as one test;
# "integration" and "all"; the folder is $FSDP_INTEGRATION when set, for run.sh's own test).
# NAMEs run only those of the set: a unit binary (test_job) or a script (test_status or
# test_status.sh); a NAME that is none of the set's is an error (exit 2), before anything runs.
# A skipped test is counted, never silent: a cmocka case that calls skip() (print_message
# says why), and an integration script that exits 77 after printing why on its last line
# (lib.sh's skip_test does both); a script that exits 77 saying nothing has failed.
# Under CI (CI=true) a skip is a failure where CI must run the test: a cmocka case that
# skips (the unit tests need no GPU: they skip only for a tool or privilege CI has), and a
# script whose skip lib.sh's ci_may_skip does not allow (lib.sh's skip_test then exits 1).
# Fixtures: tests/fixtures/ (a compressed one unpacked by make into BUILD/fixtures/); FSDP_SHARED
# (default ../shared where it exists) for the large-fixture group, skipped without it.
# Ends with the line "N passed, N failed, N skipped" and lists what failed and what was
# skipped above it; exits non-zero when anything failed.
# FSDP_TEST_JOBS (default 1) integration scripts run at a time, each reported when it ends;
# a script's header may say when it runs:
#   "# schedule: first ..."  started before the others (a long one that mostly waits: the
#                            others run beside it);
#   "# schedule: alone ..."  run with no other script beside it (it measures time or memory).
set -u
build=${1:-build}
what=${2:-all}
names=("${@:3}")
case "$what" in unit|integration|all) ;; *) echo "tests/run.sh: '$what' is not unit, integration or all"; exit 2 ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2
case "$build" in /*) ;; *) build="$here/$build" ;; esac
export FSDP_BUILD="$build"
# The fixtures are in tests/fixtures/; FSDP_SHARED, the team's reference data, is needed only by
# the large-fixture group and the fixtures' sync check (tests/fixtures/README.md): ../shared
# when it is unset and there is one beside the checkout.
if [ -z "${FSDP_SHARED+set}" ] && [ -d "$here/../shared" ]; then export FSDP_SHARED="$here/../shared"; fi
integration=${FSDP_INTEGRATION:-tests/integration}
passed=0 failed=0 skipped=0 failures=() skips=()

units=() scripts=()
[ "$what" = integration ] || for t in "$build"/tests/test_*; do [ -x "$t" ] && units+=("$t"); done
[ "$what" = unit ] || for s in "$integration"/test_*.sh; do [ -f "$s" ] && scripts+=("$s"); done
if [ "${#names[@]}" -gt 0 ]; then # keep the named ones only; every name must be one of them
    chosen_units=() chosen_scripts=()
    for n in "${names[@]}"; do
        found=0
        for t in "${units[@]+"${units[@]}"}"; do
            [ "$(basename "$t")" != "$n" ] || { chosen_units+=("$t"); found=1; }
        done
        for s in "${scripts[@]+"${scripts[@]}"}"; do
            [ "$(basename "$s" .sh)" != "${n%.sh}" ] || { chosen_scripts+=("$s"); found=1; }
        done
        [ "$found" = 1 ] || { echo "tests/run.sh: no $what test named '$n'"; exit 2; }
    done
    units=("${chosen_units[@]+"${chosen_units[@]}"}") scripts=("${chosen_scripts[@]+"${chosen_scripts[@]}"}")
fi

# The count N of cmocka's summary line "[  WORD  ] N test(s)" in $out, 0 when absent.
summary_count() {
    local n
    n=$(printf '%s\n' "$out" | sed -n "s/.*\[  $1 *\] \([0-9]*\) test(s).*/\1/p" | tail -1)
    echo "${n:-0}"
}

for t in "${units[@]+"${units[@]}"}"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(summary_count PASSED) f=$(summary_count FAILED) s=$(summary_count SKIPPED)
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed before its summary
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    [ "$f" -eq 0 ] || failures+=("$t")
    if [ "$s" -gt 0 ]; then
        # the names cmocka lists after "[  SKIPPED ] N test(s), listed below:"
        names=$(printf '%s\n' "$out" | sed -n '/\[  SKIPPED \] [0-9]* test(s), listed below/,$ s/^\[  SKIPPED \] \([^ ]*\)$/\1/p' | paste -sd ' ')
        if [ "${CI:-}" = true ]; then
            echo "$t: CI=true, and CI must run every unit test: skipped $names"
            failed=$((failed + s)) skipped=$((skipped - s))
            [ "$f" -gt 0 ] || failures+=("$t (skipped under CI: $names)")
        else
            skips+=("$t: $names")
        fi
    fi
done

# schedule_of SCRIPT: "first", "alone" or "" (its "# schedule:" header line).
schedule_of() { sed -n 's/^# schedule: \(first\|alone\)\b.*/\1/p' "$1" | head -1; }

# report SCRIPT RC SECONDS LOG: counts and prints how the script ended.
report() {
    local s=$1 rc=$2 seconds=$3 log=$4 reason
    reason=$(grep -v '^[[:space:]]*$' "$log" | tail -1)
    if [ "$rc" -eq 0 ]; then
        echo "[       OK ] $s ($seconds s)"
        passed=$((passed + 1))
    elif [ "$rc" -eq 77 ] && [ -n "$reason" ]; then
        echo "[  SKIPPED ] $s: $reason"
        skipped=$((skipped + 1)); skips+=("$s: $reason")
    else
        cat "$log"
        [ "$rc" -ne 77 ] || echo "$s: exited 77 (skipped) without saying why"
        echo "[  FAILED  ] $s"
        failed=$((failed + 1)); failures+=("$s")
    fi
}

# collect: waits for one running script to end and reports it.
collect() {
    pool_next
    report "${scripts[$POOL_ID]}" "$POOL_RC" "$POOL_SECONDS" "$pool_dir/$POOL_ID.log"
}

if [ "${#scripts[@]}" -gt 0 ]; then
    jobs=${FSDP_TEST_JOBS:-1}
    [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "tests/run.sh: FSDP_TEST_JOBS must be a positive count, got '$jobs'"; exit 2; }
    source "$here/tests/pool.sh"
    pool_dir=$(mktemp -d)
    trap 'rm -rf "$pool_dir"' EXIT
    pool_init "$pool_dir"
    first=() rest=()
    for s in "${scripts[@]}"; do
        if [ "$(schedule_of "$s")" = first ]; then first+=("$s"); else rest+=("$s"); fi
    done
    scripts=("${first[@]+"${first[@]}"}" "${rest[@]+"${rest[@]}"}")
    for i in "${!scripts[@]}"; do
        s=${scripts[$i]}
        alone=0
        [ "$(schedule_of "$s")" != alone ] || alone=1
        while [ "$(pool_size)" -ge "$jobs" ] || { [ "$alone" = 1 ] && [ "$(pool_size)" -gt 0 ]; }; do collect; done
        echo "[ RUN      ] $s"
        pool_start "$i" bash "$s"
        [ "$alone" = 0 ] || collect
    done
    while [ "$(pool_size)" -gt 0 ]; do collect; done
fi

for s in "${skips[@]+"${skips[@]}"}"; do echo "skipped: $s"; done
for f in "${failures[@]+"${failures[@]}"}"; do echo "failed: $f"; done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
