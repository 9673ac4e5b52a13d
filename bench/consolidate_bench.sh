#!/usr/bin/env bash
# Consolidation throughput against a plain copy of the same bytes (F8).  Writes a dense
# checkpoint of CONFIG in N_FILES shard files (fp32 masters filled with values, AdamW moments
# left as holes: consolidation never reads them), then times, each from a cold page cache
# when this user can drop it (root) and a warm one otherwise:
#   dd        the master sections of every shard file (one contiguous run per file), copied
#             file after file with dd bs=64M conv=fsync: the bytes consolidation reads;
#   f32 xT    fsdpctl consolidate --dtype f32 --threads T: reads and writes those bytes;
#   bf16 x4   fsdpctl consolidate (bf16, writes half of them), 4 threads.
# GB/s = fp32 master bytes / wall seconds (commit and fsyncs included).  Usage, from the
# repository root after make:
#   bench/consolidate_bench.sh [BUILD] [CONFIG] [N_FILES] [WORK_DIR]
set -euo pipefail
build=${1:-build}
config=${2:-configs/models/llama-1.1b.json}
n_files=${3:-8}
work=${4:-/tmp/fsdp-consolidate-bench}
fsdpctl=$build/fsdpctl
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

"$build/tests/test_consolidate" --write-checkpoint "$config" "$work/ckpt" "$n_files" dense
step=$work/ckpt/step-000007

u32() { od -An -tu4 -j "$2" -N4 "$1" | tr -d ' '; }
u64() { od -An -tu8 -j "$2" -N8 "$1" | tr -d ' '; }
# master_range FILE: "START BYTES" of its master sections (from the header block's end to the
# first exp_avg section, entry n_units of the section table).
master_range() {
    local units start end
    units=$(u32 "$1" 24)
    start=$(u64 "$1" 72) # entry 0's offset
    end=$(u64 "$1" $((64 + 32 * units + 8)))
    echo "$start $((end - start))"
}
total=0
for f in "$step"/rank-*.bin; do
    read -r start bytes <<< "$(master_range "$f")"
    total=$((total + bytes))
done

if sync && echo 3 > /proc/sys/vm/drop_caches 2> /dev/null; then cache=cold; else cache=warm; fi
drop() { [ "$cache" = warm ] || { sync; echo 3 > /proc/sys/vm/drop_caches; }; }
# timed NAME CMD...: runs CMD after dropping the cache; prints seconds and GB/s.
timed() {
    local name=$1 t0 t1
    shift
    drop
    t0=$(date +%s.%N)
    "$@" > /dev/null
    t1=$(date +%s.%N)
    awk -v n="$name" -v a="$t0" -v b="$t1" -v bytes="$total" \
        'BEGIN { printf "%-10s %7.2f s  %6.3f GB/s\n", n, b - a, bytes / (b - a) / 1e9 }'
}
copy_masters() {
    mkdir -p "$work/copy"
    for f in "$step"/rank-*.bin; do
        read -r start bytes <<< "$(master_range "$f")"
        dd if="$f" of="$work/copy/$(basename "$f")" bs=64M iflag=skip_bytes,count_bytes \
            skip="$start" count="$bytes" conv=fsync status=none
    done
}

echo "$(basename "$config"): $((total / 1000000)) MB of fp32 masters in $n_files shard files; $(nproc) cores; $cache page cache"
# Two rounds: on a virtual disk the first step after a large write can still pay for it.
for round in 1 2; do
    echo "round $round"
    timed dd copy_masters
    rm -rf "$work/copy"
    for threads in 1 4; do
        timed "f32 x$threads" "$fsdpctl" consolidate "$work/ckpt" "$work/out" --dtype f32 \
            --threads "$threads" --shard-size 500MB
        rm -rf "$work/out"
    done
    timed "bf16 x4" "$fsdpctl" consolidate "$work/ckpt" "$work/out" --threads 4 --shard-size 500MB
    rm -rf "$work/out"
done
