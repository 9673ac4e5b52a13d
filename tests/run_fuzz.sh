#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS, starting from its seed corpus tests/fuzz/corpus/NAME
# (copied, so the committed corpus is not modified).  Exits non-zero when a target finds a crash.
# FUZZ_JOBS targets run at a time (default 1; each is one single-threaded process, so one a
# core gives each target as many runs as alone); each is reported when it ends.
set -u
seconds=$1; shift
jobs=${FUZZ_JOBS:-1}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "run_fuzz.sh: FUZZ_JOBS must be a positive count, got '$jobs'"; exit 2; }
source "$(dirname "$0")/pool.sh"
pool_dir=$(mktemp -d)
trap 'rm -rf "$pool_dir"' EXIT
pool_init "$pool_dir"

# fuzz_one TARGET: runs TARGET from a copy of its corpus; says what it did, or why it failed
# (and exits 1).
fuzz_one() {
    local f=$1 name work status=0
    name=$(basename "$f")
    work=$(mktemp -d)
    [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$work/"
    echo "fuzzing $name for ${seconds}s"
    if ! "$f" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=0 \
         -artifact_prefix="$work/" "$work" > "$work.log" 2>&1; then
        tail -40 "$work.log"; echo "fuzz target $name failed"; status=1
        # one line for the summary at the end (a long log's tail may be all a reader sees)
        echo "$name: $(grep -m1 -E 'ERROR|SUMMARY|runtime error|out-of-memory|timeout' "$work.log" | cut -c1-200)" \
            "crash input (hex): $(for a in "$work"/crash-* "$work"/oom-* "$work"/timeout-* "$work"/leak-*; do
                [ -f "$a" ] && head -c 256 "$a" | od -An -tx1 | tr -d ' \n' && break; done)" >> "$pool_dir/failed"
    else
        grep -E "^#[0-9]+.*DONE" "$work.log" | tail -1
    fi
    rm -rf "$work" "$work.log"
    return $status
}

# collect: waits for one target to end and shows its report.
status=0
collect() {
    pool_next
    cat "$pool_dir/$POOL_ID.log"
    [ "$POOL_RC" -eq 0 ] || status=1
}

i=0
for f in "$@"; do
    while [ "$(pool_size)" -ge "$jobs" ]; do collect; done
    pool_start "$i" fuzz_one "$f"
    i=$((i + 1))
done
while [ "$(pool_size)" -gt 0 ]; do collect; done
if [ -s "$pool_dir/failed" ]; then echo "fuzz targets that failed:"; cat "$pool_dir/failed"; fi
exit $status
