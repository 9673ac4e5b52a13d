#!/usr/bin/env bash
# data.eval_fraction and train.eval_interval (F26): a quarter of the samples held out by
# index, the eval loss every 2 steps and after the last, in metrics.jsonl, the log and the
# plot; never trained on (the training loss and the step's target count are those of the
# other samples); the same eval loss bits after a resume; too few held-out samples refused.
source "$(dirname "$0")/lib.sh"
make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--data.eval_fraction=0.25 --train.eval_interval=2 --train.max_steps=6 --output.consolidate=false)
evals() { sed -n 's/.*"step":\([0-9]*\).*"eval_loss":\([-0-9.e+]*\).*/\1 \2/p' "$1"; }
"$fsdpd" --job "$tmp/job.json" "${common[@]}" --checkpoint.resume=never --runtime.metrics="$tmp/a.jsonl" \
    --checkpoint.dir="$tmp/a.ckpt" > "$tmp/a.log" 2>&1 || { cat "$tmp/a.log"; fail "the job with an eval split failed"; }
[ "$(evals "$tmp/a.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" = "2 4 6 " ] || { cat "$tmp/a.jsonl"; fail "eval losses not at steps 2, 4, 6"; }
grep -q "eval loss [0-9.]* after step 6" "$tmp/a.log" || fail "the eval loss is not logged"
read -r _ e2 <<<"$(evals "$tmp/a.jsonl" | head -1)"
read -r _ e6 <<<"$(evals "$tmp/a.jsonl" | tail -1)"
awk -v a="$e2" -v b="$e6" 'BEGIN { exit !(b < a) }' || fail "the eval loss did not fall: $e2 -> $e6"
# 96 records, every 4th held out: 72 trained on (6 steps of 12 = one epoch) and 24 held out
"$fsdpd" --job "$tmp/job.json" "${common[@]}" --train.max_steps=0 --train.epochs=1 --checkpoint.resume=never \
    --runtime.metrics="$tmp/epoch.jsonl" --checkpoint.dir="$tmp/e.ckpt" > "$tmp/e.log" 2>&1 || fail "one epoch failed"
[ "$(wc -l < "$tmp/epoch.jsonl")" -eq 6 ] || fail "an epoch of the 72 trained samples is not 6 steps: $(wc -l < "$tmp/epoch.jsonl")"
# a run that dies after step 4's checkpoint, resumed: the same eval loss after step 6, bit for bit
FSDP_FAULTS="worker=0:exit:5" "$fsdpd" --job "$tmp/job.json" "${common[@]}" --checkpoint.resume=never \
    --checkpoint.interval_steps=2 --checkpoint.async=false --checkpoint.dir="$tmp/b.ckpt" \
    --runtime.metrics="$tmp/b.jsonl" > "$tmp/b1.log" 2>&1 && fail "the run with a dying rank exited 0"
[ -e "$tmp/b.ckpt/step-000004" ] || { cat "$tmp/b1.log"; fail "no checkpoint of step 4"; }
"$fsdpd" --job "$tmp/job.json" "${common[@]}" --checkpoint.resume=auto --checkpoint.dir="$tmp/b.ckpt" \
    --runtime.metrics="$tmp/b.jsonl" > "$tmp/b2.log" 2>&1 || { cat "$tmp/b2.log"; fail "the resume failed"; }
[ "$(evals "$tmp/b.jsonl" | tail -1)" = "$(evals "$tmp/a.jsonl" | tail -1)" ] ||
    fail "resumed, the eval loss after step 6 differs: $(evals "$tmp/b.jsonl" | tail -1) vs $(evals "$tmp/a.jsonl" | tail -1)"
# the plot draws the eval loss at its 3 steps
"$fsdpctl" plot "$tmp/a.jsonl" --out "$tmp/a.svg" > /dev/null || fail "plot failed"
python3 - "$tmp/a.svg" <<'PY' || fail "the plot has no eval loss series of 3 points"
import sys, xml.etree.ElementTree as ET
svg = "{http://www.w3.org/2000/svg}"
lines = {p.get("data-series"): p.get("points").split() for p in ET.parse(sys.argv[1]).getroot().iter(svg + "polyline")}
assert len(lines["eval_loss"]) == 3 and len(lines["loss"]) == 6, {k: len(v) for k, v in lines.items()}
PY
# too few held out for one global batch
expect_status 1 "data.eval_fraction holds out 9 samples, fewer than one global batch (12)" "$fsdpd" --job "$tmp/job.json" \
    "${common[@]}" --data.eval_fraction=0.1 --checkpoint.resume=never --checkpoint.dir="$tmp/c.ckpt"
echo "eval: $(evals "$tmp/a.jsonl" | tr '\n' ' ')(step, eval loss); the same after a resume"
