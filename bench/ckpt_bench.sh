#!/usr/bin/env bash
# Checkpoint save throughput against `dd` with fsync on the same disk, and the training stall
# of an async save: builds and runs bench/ckpt_bench.c.  Prints figures; asserts nothing.
#
# usage: bench/ckpt_bench.sh [BUILD] [DIR] [GB]
#   BUILD  a build directory holding libfsdp.a (default build)
#   DIR    where to write (default $TMPDIR or /tmp); its files are removed afterwards
#   GB     size of the saved state (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
dir=${2:-${TMPDIR:-/tmp}}/fsdp-ckpt-bench.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

blas_cflags=$(pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu)
blas_libs=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -I. $blas_cflags bench/ckpt_bench.c \
    "$build/libfsdp.a" -levent -levent_pthreads -ljansson $blas_libs -lpthread -lm -o "$build/ckpt_bench"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ { print $2 }') GiB RAM, $(uname -r); $dir on" \
     "$(df -P "$dir" | awk 'NR == 2 { print $1 }') ($(findmnt -no FSTYPE -T "$dir" 2>/dev/null || echo '?'))"
OPENBLAS_NUM_THREADS=1 "$build/ckpt_bench" "$dir" "${3:-1}"
