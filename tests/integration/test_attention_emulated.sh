#!/usr/bin/env bash
# The CUDA flash-attention kernels, compiled as host C++ with the GPU instructions emulated
# (tests/gpu/emulate_attention.cc), against the CPU reference: their tiling, masking, GQA
# mapping and online softmax checked on a machine without a GPU.
source "$(dirname "$0")/lib.sh"
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
make -s -C tests/gpu emulate BUILD="$build" EMU_ARGS=--quick > "$tmp/emu.log" 2>&1 \
    || { cat "$tmp/emu.log"; fail "emulated attention"; }
tail -1 "$tmp/emu.log"
grep -q " 0 failed$" "$tmp/emu.log" || fail "emulated attention reported failures"
