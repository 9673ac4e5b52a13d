#!/usr/bin/env bash
# Builds bench/kernel_profile.c (the CUPTI kernel collector) against this machine's CUPTI into
# DIR and prints the library's path; exit 1, saying why, when there is no CUPTI or compiler.
#
#   lib=$(bench/kernel_profile.sh DIR)
#   CUDA_INJECTION64_PATH=$lib KPROF_OUT=DIR/name KPROF_SKIP_S=10 COMMAND ...
#
# CUPTI: $CUPTI, else the CUDA toolkit's (extras/CUPTI or targets/x86_64-linux).  The kernel
# record is the newest CUpti_ActivityKernelN its headers define.
set -u
dir=${1:?usage: kernel_profile.sh DIR}
cuda=${CUDA_HOME:-/usr/local/cuda}
inc= lib=
for d in ${CUPTI:+"$CUPTI"} "$cuda/extras/CUPTI" "$cuda/targets/x86_64-linux"; do
    if [ -f "$d/include/cupti.h" ]; then
        inc=$d/include
        for l in "$d/lib64" "$d/lib" "$cuda/targets/x86_64-linux/lib" "$cuda/lib64"; do
            [ -e "$l/libcupti.so" ] && { lib=$l; break; }
        done
        break
    fi
done
[ -n "$inc" ] && [ -n "$lib" ] || { echo "kernel_profile.sh: no CUPTI (cupti.h and libcupti.so) under $cuda or \$CUPTI" >&2; exit 1; }
record=$(grep -ohE '\} *CUpti_ActivityKernel[0-9]+;' "$inc"/cupti*.h | grep -oE 'CUpti_ActivityKernel[0-9]+' | sort -V | tail -1)
[ -n "$record" ] || { echo "kernel_profile.sh: no CUpti_ActivityKernelN in $inc" >&2; exit 1; }
mkdir -p "$dir" || exit 1
cc -O2 -shared -fPIC -Wall -Wextra -Werror -DKERNEL_RECORD="$record" -I"$inc" -I"$cuda/include" \
    "$(dirname "$0")/kernel_profile.c" -L"$lib" -Wl,-rpath,"$lib" -lcupti -lpthread -o "$dir/libkernel_profile.so" >&2 ||
    { echo "kernel_profile.sh: the build failed" >&2; exit 1; }
echo "$dir/libkernel_profile.so"
