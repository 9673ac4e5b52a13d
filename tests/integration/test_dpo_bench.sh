#!/usr/bin/env bash
# bench/dpo_bench.sh without a GPU: BACKEND=cpu on the real fsdpd (the tiny model, a DPO LoRA
# job on a cache of pairs), with stand-ins for what only the device has: nvidia-smi
# (per-process memory samples) and the TRL peer (PEER_PY: reads the same pairs file and prints
# the peer's JSON line).  Checked: the pairs file (rows share their prompt, labels only on the
# completion, each completion ending in EOS), fsdpd training DPO on it (TRL's metrics in its
# metrics), the table (tokens a step counted alike, the stand-in's 2 s a step, the sampler's
# peak, the fsdpd / peer ratio), a peer that counts other tokens failing, and the time budget
# skipping runs (counted).
source "$(dirname "$0")/lib.sh"

bash -n bench/dpo_bench.sh || fail "bench/dpo_bench.sh does not parse"
use_venv safetensors numpy
python3 -m py_compile bench/peer_dpo.py || fail "bench/peer_dpo.py does not compile"

# The pairs: 3 pairs of 4 + 6 tokens over a vocabulary of 50.
PATH="$venv/bin:$PATH" python3 bench/peer_dpo.py --write-pairs "$tmp/p.safetensors" --pairs 3 --prompt 4 \
    --completion 6 --vocab 50 > /dev/null || fail "--write-pairs failed"
"$venv/bin/python" - "$tmp/p.safetensors" <<'PY' || fail "the pairs file"
import sys
import numpy as np
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
ids, labels = t["input_ids"], t["labels"]
assert ids.shape == (6, 10) and ids.dtype == np.int32, ids.shape
assert (ids[0::2, :4] == ids[1::2, :4]).all(), "a pair's rows do not share the prompt"
assert not (ids[0::2, 4:] == ids[1::2, 4:]).all(), "chosen = rejected"
assert (labels[:, :4] == -100).all() and (labels[:, 4:] == ids[:, 4:]).all(), "labels"
assert (ids[:, -1] == 2).all() and (ids[:, :-1] >= 3).all() and (ids < 50).all(), "ids"
PY

fake=$tmp/fake
mkdir -p "$fake/bin"
cat > "$fake/bin/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in
*query-compute-apps*) printf '4242, 1000\n4242, 3072\n4343, 200\n'; exec sleep 120 ;;
*) echo "0, stand-in GPU, 143771 MiB, 0.0" ;;
esac
SH
# The peer's stand-in: its tokens a step from the pairs file (MISCOUNT=1: one row fewer), 2 s a step.
cat > "$fake/peer.py" <<'PY'
import argparse, json, os
from safetensors.numpy import load_file
ap = argparse.ArgumentParser()
for a in ("--data", "--peer-torch"): ap.add_argument(a)
for a in ("--pairs", "--steps", "--warm", "--vocab"): ap.add_argument(a, type=int)
a = ap.parse_args()
ids = load_file(a.data)["input_ids"]
assert os.path.basename(a.peer_torch) == "peer_torch.py", a.peer_torch
rows = 2 * a.pairs - (1 if os.environ.get("MISCOUNT") == "1" else 0)
tok = rows * ids.shape[1]
print("stand-in peer")
print("{'train_runtime': '14.64', 'train_loss': '0.727'}")  # the Trainer's log lines, Python dicts
print(json.dumps(dict(peer="stand-in", tokens_a_step=tok, step_s=2.0, tokens_per_s=tok / 2.0, timed_steps=a.steps,
                      peak_mem_gib=1.5, loss=0.69)))
PY
chmod +x "$fake/bin/"*

status=0
PATH="$fake/bin:$venv/bin:$PATH" OUT="$tmp/out" BACKEND=cpu PEER=1 PEER_PY="$fake/peer.py" STEPS=5 \
    timeout 300 bash bench/dpo_bench.sh "$build" > "$tmp/bench.out" 2>&1 || status=$?
show() { cat "$tmp/bench.out"; fail "$*"; }
[ "$status" -eq 0 ] || show "dpo_bench.sh exited $status"
grep -qF "2 pairs a step of 32 + 96 tokens (512 tokens a step, both rows)" "$tmp/bench.out" || show "the header"
grep -q '"rewards/accuracies"' "$tmp/out/dpo_fsdpd.jsonl" || show "fsdpd did not train DPO (no rewards/accuracies)"
[ "$(wc -l < "$tmp/out/dpo_fsdpd.jsonl")" -eq 5 ] || show "fsdpd ran $(wc -l < "$tmp/out/dpo_fsdpd.jsonl") steps, not 5"
# 512 tokens a step / 2 s = 256 tokens/s; the sampler's largest process 3072 MiB
grep -qE '^\| peer \| 256 \| 2\.000 \| 1\.50 \| 3072 \|$' "$tmp/bench.out" || show "the peer's row"
row=$(grep -E '^\| fsdpd \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| 3072 \|$' "$tmp/bench.out") || show "the fsdpd row"
tps=$(echo "$row" | awk -F ' *\\| *' '{ print $3 }')
ratio=$(sed -n 's/^fsdpd \/ peer: \([0-9.]*\)x tokens\/s, .*x peak allocated memory$/\1/p' "$tmp/bench.out")
[ -n "$ratio" ] || show "no ratio line"
awk -v t="$tps" -v r="$ratio" 'BEGIN { d = t / 256 - r; exit !(d < 0.01 && d > -0.01) }' ||
    show "$tps tokens/s against 256 is not ${ratio}x"
grep -q "^nothing failed$" "$tmp/bench.out" || show "the summary"

# A peer that counts other tokens than fsdpd: a failure, named.
status=0
PATH="$fake/bin:$venv/bin:$PATH" OUT="$tmp/out2" BACKEND=cpu PEER=1 PEER_PY="$fake/peer.py" MISCOUNT=1 STEPS=4 \
    timeout 300 bash bench/dpo_bench.sh "$build" > "$tmp/bench2.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || { cat "$tmp/bench2.out"; fail "exit $status with a peer counting other tokens"; }
grep -qF "the peer counted 384 tokens a step, fsdpd 512" "$tmp/bench2.out" || { cat "$tmp/bench2.out"; fail "no count mismatch"; }
grep -qF "fsdpd / peer: not both sides ran" "$tmp/bench2.out" || { cat "$tmp/bench2.out"; fail "a ratio without the peer"; }

# No time left: both runs skipped (counted), not failed; without PEER=1 the peer is skipped.
status=0
PATH="$fake/bin:$venv/bin:$PATH" OUT="$tmp/out3" BACKEND=cpu BUDGET_S=45 timeout 60 bash bench/dpo_bench.sh "$build" \
    > "$tmp/bench3.out" 2>&1 || status=$?
[ "$status" -eq 0 ] || { cat "$tmp/bench3.out"; fail "exit $status with runs skipped"; }
grep -qE "^SKIPPED: fsdpd: [0-9-]+s left of BUDGET_S" "$tmp/bench3.out" || { cat "$tmp/bench3.out"; fail "no time skip"; }
grep -qF "SKIPPED: peer: TRL's DPOTrainer needs CUDA (BACKEND=cpu)" "$tmp/bench3.out" || { cat "$tmp/bench3.out"; fail "no peer skip"; }
grep -q "^nothing failed; 2 skipped$" "$tmp/bench3.out" || { cat "$tmp/bench3.out"; fail "the summary does not count"; }
echo "bench/dpo_bench.sh: pairs, fsdpd DPO, table, token counts, budget checked on the CPU"
