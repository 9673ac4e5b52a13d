#!/usr/bin/env bash
# scripts/sync-fixtures.sh [--check] [SHARED]
# The test fixtures of tests/fixtures/ (golden/, tokenizers/, data/) are copies of SHARED's
# (default $FSDP_SHARED, else ../shared beside the checkout): this refreshes them from it, or
# with --check only compares, listing every file that differs, is missing or is extra, and
# exits 1 when any does (tests/integration/test_fixtures_sync.sh runs it).
# A file over 4 MiB is stored as NAME.gz (gzip -9n: the same bytes on every run; the
# Makefile unpacks it into BUILD/fixtures/NAME) and compared after gunzip.  The large
# fixtures (LARGE below) are not copied: the tests that need them read them from
# $FSDP_SHARED (tests/fixtures/README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
check=0
[ "${1:-}" != --check ] || { check=1; shift; }
shared=${1:-${FSDP_SHARED:-$here/../shared}}
dirs=(golden tokenizers data)
LARGE=(golden/nf4_extra.safetensors)
limit=$((4 * 1024 * 1024))
fixtures=$here/tests/fixtures
for d in "${dirs[@]}"; do
    [ -d "$shared/$d" ] || { echo "sync-fixtures: no $shared/$d" >&2; exit 2; }
done

# is_large REL: REL is one of LARGE.
is_large() {
    local l
    for l in "${LARGE[@]}"; do [ "$1" != "$l" ] || return 0; done
    return 1
}

# stored_name REL: the name REL has under tests/fixtures (REL.gz when over the limit).
stored_name() {
    if [ "$(stat -c %s "$shared/$1")" -gt "$limit" ]; then echo "$1.gz"; else echo "$1"; fi
}

# sources: every file of SHARED's fixture folders but the large ones, relative, sorted.
sources() {
    local rel
    (cd "$shared" && find "${dirs[@]}" -type f | LC_ALL=C sort) | while read -r rel; do
        is_large "$rel" || echo "$rel"
    done
}

if [ "$check" = 0 ]; then
    for d in "${dirs[@]}"; do rm -rf "${fixtures:?}/$d"; done
    sources | while read -r rel; do
        stored=$(stored_name "$rel")
        mkdir -p "$(dirname "$fixtures/$stored")"
        if [ "$stored" = "$rel" ]; then cp "$shared/$rel" "$fixtures/$rel"
        else gzip -9n -c "$shared/$rel" > "$fixtures/$stored"; fi
    done
    echo "sync-fixtures: tests/fixtures/{$(IFS=,; echo "${dirs[*]}")} refreshed from $shared"
    exit 0
fi

differ=0
expected=$(mktemp)
trap 'rm -f "$expected"' EXIT
while read -r rel; do
    stored=$(stored_name "$rel")
    echo "$stored" >> "$expected"
    if [ ! -f "$fixtures/$stored" ]; then
        echo "missing: tests/fixtures/$stored (from $shared/$rel)"; differ=1
    elif [ "$stored" = "$rel" ]; then
        cmp -s "$shared/$rel" "$fixtures/$rel" || { echo "differs: tests/fixtures/$rel"; differ=1; }
    else
        gzip -dc "$fixtures/$stored" | cmp -s "$shared/$rel" - || { echo "differs: tests/fixtures/$stored"; differ=1; }
    fi
done < <(sources)
while read -r rel; do
    grep -qxF "$rel" "$expected" || { echo "extra: tests/fixtures/$rel (not in $shared)"; differ=1; }
done < <(cd "$fixtures" && find "${dirs[@]}" -type f 2> /dev/null | LC_ALL=C sort)
[ "$differ" = 0 ] || { echo "sync-fixtures: tests/fixtures differs from $shared: run scripts/sync-fixtures.sh"; exit 1; }
echo "sync-fixtures: tests/fixtures matches $shared"
