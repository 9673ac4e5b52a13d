#!/usr/bin/env bash
# train.precision fp8 beside bf16 (F45) on one GPU, in one call: the same full fine-tune
# (random base, full recompute, SEQ 2048 tokens a row, BATCH rows, STEPS steps, the first WARM
# not timed) with the decoder projections in bf16, then in FP8 (tensorwise; SCALING=rowwise
# needs sm_100): tokens/s, the losses, peaks (tests/gpu/lib.sh measured_run), and the ratio.
#   OUT=$OUT bash bench/fp8_bench.sh BUILD [MODEL.json...]
# BUILD holds fsdpd, fsdp-worker and fsdpctl built with CUDA; MODEL defaults to Llama-2-7B.
# BACKEND=cpu SEQ=64 BATCH=2 STEPS=4 ... configs/models/tiny.json tries the logic on a CPU.
set -u
build=${1:?usage: bench/fp8_bench.sh BUILD [MODEL.json...]}
shift
[ $# -gt 0 ] || set -- configs/models/llama2-7b.json
out=${OUT:-/tmp/fsdp-fp8-bench} work=$(mktemp -d /tmp/fsdp-fp8.XXXXXX)
mkdir -p "$out"
. tests/gpu/lib.sh
trap 'unsample; rm -rf "$work"' EXIT
export NCCL_NVLS_ENABLE=0
for model in "$@"; do
    m=$(basename "$model" .json)
    SEQ=${SEQ:-2048} WARM=${WARM:-2} measured_run "${m}_bf16" "$model" full 1 "${STEPS:-6}" "${BATCH:-4}" 200
    SEQ=${SEQ:-2048} WARM=${WARM:-2} measured_run "${m}_fp8" "$model" full 1 "${STEPS:-6}" "${BATCH:-4}" 200 \
        --train.precision=fp8 --train.fp8_scaling="${SCALING:-tensorwise}"
    grep -h "train.precision fp8" "$out/${m}_fp8.log" | head -1
    python3 - "$out/${m}_bf16.jsonl" "$out/${m}_fp8.jsonl" "$m" "${WARM:-2}" <<'PY' || echo "$m: no ratio (a run failed)"
import json, sys
w = int(sys.argv[4])
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
ta, tb = (sum(r["seconds"] for r in x[w:]) / len(x[w:]) for x in (a, b))
print(f"{sys.argv[3]}: fp8 {ta / tb:.3f}x bf16's tokens/s ({ta:.3f} -> {tb:.3f} s a step); losses "
      + " ".join(f"{x['loss']:.4f}/{y['loss']:.4f}" for x, y in zip(a, b)))
PY
done
