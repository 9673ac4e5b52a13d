#!/usr/bin/env bash
# bench/step_bench.sh without a GPU: BACKEND=cpu on the real fsdpd (the tiny model), with
# stand-ins for what only the device has: nvidia-smi (per-process memory samples), torch (its
# distributed launcher prints the peer's JSON line) and nsys (PROFILE=1).  Checked: the
# parameter counts and FLOPs a token of the model jsons, the table's figures (GFLOP a token,
# fsdpd / peer, the GPU peak the sampler saw), row c reusing row b's peer run, a peer whose
# model is not the row's model failing the table, the profile's kernel table, the time
# budget skipping runs, an unknown row failing, and the exit status.
source "$(dirname "$0")/lib.sh"

bash -n bench/step_bench.sh || fail "bench/step_bench.sh does not parse"

# The arithmetic: every parameter (the counts transformers gives these shapes) and
# 6 (N - V d) + 12 L d T a token.
flops() { python3 bench/step_table.py flops "configs/models/$1.json" 2048; }
flops llama-1.1b | grep -qF "1100048384 parameters, 7.314 GFLOP" || fail "1.1B: $(flops llama-1.1b)"
flops llama2-7b | grep -qF "6738415616 parameters, 42.865 GFLOP" || fail "7B: $(flops llama2-7b)"
flops llama3.1-8b | grep -qF "8030261248 parameters, 48.251 GFLOP" || fail "8B: $(flops llama3.1-8b)"
flops tiny | grep -qF "19286272 parameters" || fail "tiny: $(flops tiny)"

# bench/kernel_profile.c's table (CUPTI only on the device): the categories in ms a step, and the
# idle gaps summed by the kernels around them, largest first.
printf '# span_ns\t1000000\n10\t500000\tgemm_a\n5\t300000\tswiglu_fwd\n# gap\t1\t20000\tgemm_a\tswiglu_fwd\n# gap\t3\t60000\tadamw_kernel\tgemm_a\n' > "$tmp/k.tsv"
cupti=$(python3 bench/step_table.py cupti 0.5 5 "$tmp/k.tsv") || fail "step_table.py cupti: $cupti"
echo "$cupti" | grep -qE '^ +GPU idle +100\.0 +20\.0' || fail "the idle share: $cupti"
echo "$cupti" | grep -qF "gaps of 10 us or more: 40.0 ms a step" || fail "the gaps' sum: $cupti"
echo "$cupti" | grep -A1 "before -> after" | grep -qE '30\.00 ms a step +3 gaps +adamw_kernel -> gemm_a' ||
    fail "the largest gap first: $cupti"

fake=$tmp/fake
mkdir -p "$fake/bin" "$fake/py/torch/distributed"
cat > "$fake/bin/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in
*query-compute-apps*) printf '4242, 1000\n4242, 3072\n4343, 200\nNo running processes found\n'; exec sleep 120 ;;
*) echo "0, stand-in GPU, 143771 MiB, 0.0" ;;
esac
SH
cat > "$fake/bin/nsys" <<'SH'
#!/bin/sh
# profile [-t X -s X -o BASE --k=v ...] CMD...: writes BASE.nsys-rep, runs CMD; stats: a kernel table
if [ "$1" = profile ]; then
    shift
    while [ $# -gt 0 ]; do
        case $1 in -o) base=$2; shift 2 ;; -t | -s) shift 2 ;; --*=*) shift ;; *) break ;; esac
    done
    : > "$base.nsys-rep"
    exec "$@"
fi
echo "Processing report"
echo '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"'
echo '25.0,50000000,500,100000,100000,1,1,0,"attention_bwd"'
echo '75.0,150000000,1000,150000,150000,1,1,0,"gemm_bf16"'
SH
: > "$fake/py/torch/__init__.py"
: > "$fake/py/torch/distributed/__init__.py"
# The launcher's stand-in: the peer's JSON line; llama2-7b's count is not the tiny model's.
cat > "$fake/py/torch/distributed/run.py" <<'PY'
import json, sys
a = sys.argv[1:]
arg = lambda k: a[a.index(k) + 1]
n = {"llama-1.1b": 19286272, "llama2-7b": 6738415616}[arg("--model")]
tok = int(arg("--batch")) * int(arg("--seq"))
print("stand-in launcher")
print(json.dumps(dict(peer="stand-in", params_b=n / 1e9, step_s=2.0, tokens_per_s=tok / 2.0, mfu=0.0,
                      peak_mem_gib=1.5, loss=9.5, optimizer="fused")))
PY
chmod +x "$fake/bin/"*

status=0
PATH="$fake/bin:$PATH" PYTHONPATH="$fake/py" OUT="$tmp/out" BACKEND=cpu PEER=1 PROFILE=1 ROWS=a,b,c STEPS=5 \
    timeout 300 bash bench/step_bench.sh "$build" > "$tmp/bench.out" 2>&1 || status=$?
show() { cat "$tmp/bench.out"; fail "$*"; }
[ "$status" -eq 1 ] || show "step_bench.sh exited $status, expected 1 (row b's peer is not its model)"
row_a=$(grep '^| a: .*| fsdpd, activation_checkpointing=full |' "$tmp/bench.out") || show "no fsdpd line in row a"
# seq 128: 6 (19286272 - 32000 x 256) + 12 x 4 x 256 x 128 = 68138496 FLOPs a token; the
# stand-in peer runs 2 x 128 / 2 s = 128 tokens/s; the sampler's largest process 3072 MiB.
echo "$row_a" | grep -qE '^\| a: [^|]*\| [^|]*\| 2 x 128 \| 0\.068 \| [0-9.]+ \| [0-9,]+ \| [0-9.e-]+% \| [0-9.]+x \| 3\.0 \| [0-9.]+ \(context peak allocated\) \|' ||
    show "row a's fsdpd figures: $row_a"
tps=$(echo "$row_a" | awk -F ' *\\| *' '{ gsub(",", "", $7); print $7 }')
ratio=$(echo "$row_a" | awk -F ' *\\| *' '{ print $9 }')
# (tokens/s is printed rounded: the ratio within 0.01 of it)
awk -v t="$tps" -v r="${ratio%x}" 'BEGIN { d = t / 128 - r; exit !(d < 0.01 && d > -0.01) }' ||
    show "row a: $tps tokens/s against 128 is not $ratio"
grep -qE '^\| a: .*\| PyTorch FSDP2, full recompute \| 2 x 128 \| 0\.068 \| 2\.000 \| 128 \| .* \| - \| 3\.0 \| 1\.5 \(max_memory_allocated\) \| 9\.500 \|' "$tmp/bench.out" ||
    show "row a's peer line"
grep -qF "PyTorch FSDP2, full recompute (the peer has no selective mode) (reused: row b's run)" "$tmp/bench.out" ||
    show "row c does not reuse row b's peer run"
grep -qF "MISMATCH: row b: the peer's model has 6738415616 parameters, configs/models/tiny.json 19286272" "$tmp/bench.out" ||
    show "no mismatch for row b's peer"
grep -q "^failed: table: exit 1" "$tmp/bench.out" || show "the mismatch is not a failure"
grep -qE "^ +75\.0 +30\.00 +200\.0  gemm_bf16" "$tmp/bench.out" || show "the profile's kernel table"
grep -qF "GPU kernel time: 200.0 ms over 5 steps = 40.0 ms a step" "$tmp/bench.out" || show "the profile's total"
[ -s "$tmp/out/step_bench.md" ] || show "no table in \$OUT/step_bench.md"

# No time left: every run skipped (counted), an unknown row failed; no nvidia-smi, no peer.
status=0
OUT="$tmp/out2" BACKEND=cpu BUDGET_S=45 ROWS=a,x timeout 60 bash bench/step_bench.sh "$build" > "$tmp/bench2.out" 2>&1 ||
    status=$?
[ "$status" -eq 1 ] || { cat "$tmp/bench2.out"; fail "exit $status with an unknown row"; }
grep -qF "unknown row 'x' (a, b, c, d, e, q)" "$tmp/bench2.out" || { cat "$tmp/bench2.out"; fail "the unknown row is not named"; }
grep -qE "^SKIPPED: a_fsdpd_full: [0-9-]+s left of BUDGET_S" "$tmp/bench2.out" || { cat "$tmp/bench2.out"; fail "no time skip"; }
grep -qF "SKIPPED: a_peer_full: the PyTorch peer needs CUDA (BACKEND=cpu)" "$tmp/bench2.out" || { cat "$tmp/bench2.out"; fail "no peer skip"; }
grep -q "^1 failed; 2 skipped$" "$tmp/bench2.out" || { cat "$tmp/bench2.out"; fail "the summary does not count"; }
grep -qF "| a: Llama 1.1B (BACKEND=cpu: tiny.json) | fsdpd, activation_checkpointing=full | 2 x 128 | 0.068 | skipped (time) |" \
    "$tmp/bench2.out" || { cat "$tmp/bench2.out"; fail "the skipped run is not in the table"; }
echo "bench/step_bench.sh: table, arithmetic, peer reuse and checks, profile, budget checked on the CPU"
