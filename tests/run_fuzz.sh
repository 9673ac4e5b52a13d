#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS, starting from its seed corpus tests/fuzz/corpus/NAME
# (copied, so the committed corpus is not modified).  Exits non-zero when a target finds a crash.
set -u
seconds=$1; shift
status=0
for f in "$@"; do
    name=$(basename "$f")
    work=$(mktemp -d)
    [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$work/"
    echo "fuzzing $name for ${seconds}s"
    if ! "$f" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=0 \
         -artifact_prefix="$work/" "$work" > "$work.log" 2>&1; then
        tail -40 "$work.log"; echo "fuzz target $name failed"; status=1
    else
        grep -E "^#[0-9]+.*DONE" "$work.log" | tail -1
    fi
    rm -rf "$work" "$work.log"
done
exit $status
