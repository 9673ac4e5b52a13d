#!/usr/bin/env bash
# bench/fp8_gather_bench.sh (F50) without a GPU: BACKEND=cpu on the real fsdpd, the tiny model
# on 1 and 2 CPU workers with train.precision fp8 (emulated exactly), its weights gathered in
# the compute dtype and as e4m3 codes.  Checked: the script's comparison of the two runs' losses
# (the same bits, each count), the table's rows, the bytes a rank gathered a step (none on one
# worker; fewer, but some, as codes on two), the scaling and ratio columns, exit 0; and
# step_table.py comm on kernel_profile.c tables: NCCL's time a step and its exposed part, from
# the rank with the largest exposed share.
source "$(dirname "$0")/lib.sh"

bash -n bench/fp8_gather_bench.sh || fail "bench/fp8_gather_bench.sh does not parse"

# Two ranks' tables: rank a has more NCCL time, rank b more of it exposed; a step of 0.5 s.
printf '# span_ns\t1000000\n10\t500000\tgemm_a\n3\t300000\tncclDevKernel_AllGather\n# comm\t300000\t20000\n' > "$tmp/k.1.tsv"
printf '# span_ns\t1000000\n10\t500000\tgemm_a\n3\t200000\tncclDevKernel_AllGather\n# comm\t200000\t50000\n' > "$tmp/k.2.tsv"
comm=$(python3 bench/step_table.py comm 0.5 "$tmp/k.1.tsv" "$tmp/k.2.tsv") || fail "step_table.py comm: $comm"
[ "$comm" = '{"comm_ms": 100.0, "exposed_ms": 25.0}' ] || fail "step_table.py comm: $comm (want rank b's 100 ms, 25 exposed)"
printf '# span_ns\t1000000\n10\t500000\tgemm_a\n' > "$tmp/none.1.tsv"
python3 bench/step_table.py comm 0.5 "$tmp/none.1.tsv" > /dev/null 2>&1 && fail "step_table.py comm without a '# comm' line exited 0"
python3 bench/step_table.py cupti 0.5 3 "$tmp/k.2.tsv" | grep -qF "NCCL's kernels 100.0 ms a step, 25.0 of it with no other kernel" ||
    fail "step_table.py cupti does not say the communication: $(python3 bench/step_table.py cupti 0.5 3 "$tmp/k.2.tsv")"

out=$tmp/out
BACKEND=cpu SEQ=64 STEPS=6 WARM=2 OUT=$out bash bench/fp8_gather_bench.sh "$build" configs/models/tiny.json > "$tmp/bench.log" 2>&1 ||
    { tail -20 "$tmp/bench.log"; fail "bench/fp8_gather_bench.sh BACKEND=cpu: exit $?"; }
grep -q "^nothing failed" "$tmp/bench.log" || { tail -5 "$tmp/bench.log"; fail "the summary does not say nothing failed"; }
for g in 1 2; do
    grep -q "tiny_g${g}_bf16g vs tiny_g${g}_fp8g: 6 steps, largest relative loss difference 0.00e+00" "$tmp/bench.log" ||
        fail "$g worker(s): the losses of the two gathers not compared as the same bits"
done
grep -q "their weights gathered as e4m3 codes" "$tmp/bench.log" || fail "the FP8 gathers' run does not say so"
grep -q "their weights gathered in the compute dtype" "$tmp/bench.log" || fail "the bf16 gathers' run does not say so"
# | run | GPUs | tokens/s a GPU | s a step | scaling | gathered | NCCL | peak | over bf16g |
col() { awk -F' *\\| *' -v r="$1" -v c="$2" '$2 == r { print $(c + 1) }' "$out/fp8_gather.md"; }
[ "$(grep -c '^| tiny_g' "$out/fp8_gather.md")" = 4 ] || fail "the table has not 4 rows: $(cat "$out/fp8_gather.md")"
[ "$(col tiny_g1_bf16g 6)" = "0.0 MiB" ] || fail "one worker gathered $(col tiny_g1_bf16g 6) a step"
b=$(col tiny_g2_bf16g 6) f=$(col tiny_g2_fp8g 6)
awk -v b="${b% MiB}" -v f="${f% MiB}" 'BEGIN { exit !(f > 0 && f < b) }' ||
    fail "two workers gathered $f a step as codes, $b in the compute dtype: not fewer"
col tiny_g2_fp8g 5 | grep -qE '^[0-9.]+ \(of 1\)$' || fail "the scaling column: $(col tiny_g2_fp8g 5)"
col tiny_g2_fp8g 9 | grep -qE '^[0-9.]+x$' || fail "the ratio to bf16 gathers: $(col tiny_g2_fp8g 9)"
echo "fp8_gather_bench on the CPU: a rank gathered $f a step as codes, $b in the compute dtype; the same losses"
