#!/usr/bin/env bash
# tests/run.sh counts what it ran: cmocka cases passed, failed and skipped (a real cmocka
# binary, built here), and integration scripts that pass, fail, or exit 77 to be skipped
# (saying why; a silent 77 is a failure).  The last line is "N passed, N failed, N skipped".
# Under CI=true a cmocka skip and a script's skip for anything but a missing GPU fail.
# Names run only the named unit binaries and scripts.
# With FSDP_TEST_JOBS=2 the counts are the same, two scripts run side by side, a script with
# "# schedule: first" starts before the others and one with "# schedule: alone" has none beside
# it.
source "$(dirname "$0")/lib.sh"
# A run.sh that ignored $FSDP_INTEGRATION would run the real scripts, this one among them.
[ -z "${FSDP_RUN_COUNTS_NESTED:-}" ] || fail "run.sh ran tests/integration, not \$FSDP_INTEGRATION"

mkdir -p "$tmp/build/tests" "$tmp/it"
cat > "$tmp/cases.c" <<'C'
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
static void runs(void **s) { (void)s; }
static void skips_a(void **s) { (void)s; print_message("needs root\n"); skip(); }
static void skips_b(void **s) { (void)s; skip(); }
int main(void) {
    const struct CMUnitTest t[] = {cmocka_unit_test(runs), cmocka_unit_test(skips_a),
                                   cmocka_unit_test(skips_b)};
    return cmocka_run_group_tests(t, NULL, NULL);
}
C
${CC:-cc} "$tmp/cases.c" -lcmocka -o "$tmp/build/tests/test_cases" || fail "cannot build the cmocka binary"
printf 'exit 0\n' > "$tmp/it/test_a_pass.sh"
printf 'source tests/integration/lib.sh\nskip_test "no GPU on this machine"\n' > "$tmp/it/test_b_skip.sh"
printf 'exit 77\n' > "$tmp/it/test_c_silent.sh"

run() { # [JOBS [FOLDER]]: CI is $RUN_CI (unset: not CI, whatever runs this test)
    CI="${RUN_CI:-}" FSDP_RUN_COUNTS_NESTED=1 FSDP_TEST_JOBS="${1:-1}" FSDP_INTEGRATION="${2:-$tmp/it}" timeout 60 \
        tests/run.sh "$tmp/build" all > "$tmp/run.out" 2>&1
}
status=0
run || status=$?
[ "$status" -ne 0 ] || { cat "$tmp/run.out"; fail "a silent exit 77 did not fail the run"; }
last=$(tail -1 "$tmp/run.out")
[ "$last" = "2 passed, 1 failed, 3 skipped" ] || { cat "$tmp/run.out"; fail "last line: '$last'"; }
grep -qxF "skipped: $tmp/build/tests/test_cases: skips_a skips_b" "$tmp/run.out" || { cat "$tmp/run.out"; fail "the skipped cases are not listed"; }
grep -qxF "skipped: $tmp/it/test_b_skip.sh: SKIP: no GPU on this machine" "$tmp/run.out" || { cat "$tmp/run.out"; fail "the skipped script and its reason are not listed"; }
grep -qF "test_c_silent.sh: exited 77 (skipped) without saying why" "$tmp/run.out" || fail "the silent skip is not explained"
grep -qxF "failed: $tmp/it/test_c_silent.sh" "$tmp/run.out" || fail "the silent skip is not listed as failed"

status=0
run 2 || status=$?
[ "$status" -ne 0 ] && [ "$(tail -1 "$tmp/run.out")" = "2 passed, 1 failed, 3 skipped" ] &&
    grep -qxF "failed: $tmp/it/test_c_silent.sh" "$tmp/run.out" || { cat "$tmp/run.out"; fail "FSDP_TEST_JOBS=2: other counts"; }

rm "$tmp/it/test_c_silent.sh"
run || { cat "$tmp/run.out"; fail "run.sh failed with nothing failing"; }
last=$(tail -1 "$tmp/run.out")
[ "$last" = "2 passed, 0 failed, 3 skipped" ] || { cat "$tmp/run.out"; fail "last line: '$last'"; }
echo "run.sh: $last"

# --- names: only the named unit binary and script; a name of none is an error ---------------
names() { # SET NAME...
    CI="" FSDP_RUN_COUNTS_NESTED=1 FSDP_INTEGRATION="$tmp/it" timeout 60 tests/run.sh "$tmp/build" "$@" > "$tmp/run.out" 2>&1
}
names all test_cases test_a_pass.sh && [ "$(tail -1 "$tmp/run.out")" = "2 passed, 0 failed, 2 skipped" ] &&
    ! grep -q test_b_skip "$tmp/run.out" || { cat "$tmp/run.out"; fail "all test_cases test_a_pass.sh: other tests ran"; }
names integration test_b_skip && [ "$(tail -1 "$tmp/run.out")" = "0 passed, 0 failed, 1 skipped" ] ||
    { cat "$tmp/run.out"; fail "integration test_b_skip: other counts"; }
names unit test_cases && [ "$(tail -1 "$tmp/run.out")" = "1 passed, 0 failed, 2 skipped" ] ||
    { cat "$tmp/run.out"; fail "unit test_cases: other counts"; }
status=0
names unit test_a_pass || status=$?
[ "$status" = 2 ] && grep -qxF "tests/run.sh: no unit test named 'test_a_pass'" "$tmp/run.out" ||
    { cat "$tmp/run.out"; fail "a script named in the unit set: exit $status"; }
echo "run.sh: names run only the named tests"

# --- CI=true: the cmocka skips and a script's skip for a missing package fail, "no GPU" skips ---
printf 'source tests/integration/lib.sh\nskip_test "cannot install safetensors into the venv"\n' > "$tmp/it/test_d_pkg.sh"
status=0
RUN_CI=true run || status=$?
last=$(tail -1 "$tmp/run.out")
[ "$status" -ne 0 ] && [ "$last" = "2 passed, 3 failed, 1 skipped" ] || { cat "$tmp/run.out"; fail "CI=true: '$last'"; }
grep -qxF "failed: $tmp/build/tests/test_cases (skipped under CI: skips_a skips_b)" "$tmp/run.out" &&
    grep -qxF "failed: $tmp/it/test_d_pkg.sh" "$tmp/run.out" &&
    grep -qF "FAIL: CI=true, and CI must run this test: it would have been skipped: cannot install safetensors" "$tmp/run.out" &&
    grep -qxF "skipped: $tmp/it/test_b_skip.sh: SKIP: no GPU on this machine" "$tmp/run.out" ||
    { cat "$tmp/run.out"; fail "CI=true: the skips CI must not take are not failures, or 'no GPU' is"; }
rm "$tmp/it/test_d_pkg.sh"
echo "run.sh, CI=true: $last"

# --- FSDP_TEST_JOBS=2: side by side, first, alone ---------------------------------------------
# Each script records itself in $tmp/par.running while it runs and its start in $tmp/par.order.
mkdir -p "$tmp/par" "$tmp/par.running"
script() { # NAME SCHEDULE BODY: a script of $tmp/par
    cat > "$tmp/par/test_$1.sh" <<SH
$2
set -e
touch "$tmp/par.running/$1"; echo $1 >> "$tmp/par.order"
$3
rm "$tmp/par.running/$1"
SH
}
# a and b each wait (10 s at most) for the other to start: both pass only side by side.
meet() { echo 'for i in $(seq 100); do grep -qx '"$1 $tmp/par.order"' && break; sleep 0.1; done; grep -qx '"$1 $tmp/par.order"; }
script a "" "$(meet b)"
script b "" "$(meet a)"
script c "# schedule: alone (this test's own)" 'sleep 0.5; r=$(ls '"$tmp/par.running"'); [ "$r" = c ] || { echo "beside: $r"; exit 1; }'
script d "" 'sleep 0.5'
script z "# schedule: first (this test's own)" 'sleep 0.5'
run 2 "$tmp/par" || { cat "$tmp/run.out"; fail "FSDP_TEST_JOBS=2: a script failed"; }
[ "$(tail -1 "$tmp/run.out")" = "6 passed, 0 failed, 2 skipped" ] || { cat "$tmp/run.out"; fail "FSDP_TEST_JOBS=2: other counts"; }
# started first: run.sh launched it first (its own RUN lines, in launch order; which script
# writes its first line first is up to the machine's scheduler when two start together)
first=$(grep -m1 '\[ RUN .*\.sh' "$tmp/run.out")
case "$first" in *test_z.sh*) ;; *) cat "$tmp/run.out"; fail "the script scheduled first was not started first: $first" ;; esac
echo "run.sh, FSDP_TEST_JOBS=2: $(tail -1 "$tmp/run.out"), start order $(paste -sd ' ' "$tmp/par.order")"
