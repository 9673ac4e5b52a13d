#!/usr/bin/env bash
# A run that explains itself (F39), a LoRA job on the CPU backend:
#  - before the model loads, the job as resolved (a * on the keys set away from their defaults)
#    and the derived values (global batch = micro-batch x accumulation x ranks, trainable of
#    total parameters, the targeted modules) in the log, OUTPUT_DIR/job.json (a job file that
#    fsdpctl plan and fsdpd load) and OUTPUT_DIR/run.json;
#  - step lines every runtime.log_every (--logging_steps) steps, the last and the eval steps
#    always, with tokens/s, the label tokens beside the tokens computed, elapsed and an ETA
#    from the mean of the last steps' seconds (checked against metrics.jsonl);
#  - the summary at the end (steps, tokens, tokens/s, eval losses, checkpoints, how to load
#    the output) against metrics.jsonl, in the log and run.json;
#  - fsdpctl status --output DIR and --job-id ID of the finished job;
#  - a resumed run: fsdpctl plot draws a marker at the resumed step; no eval panel without eval.
source "$(dirname "$0")/lib.sh"

write_base_job lora
export TMPDIR=$tmp XDG_RUNTIME_DIR= # the status sockets and the output record in $tmp/fsdpd-UID
unset SLURM_JOB_ID
# a step of about 0.3 s (for a measurable ETA), an eval every 3 steps, a step line every 2
run_job a step_delay=0:0.3 -- --logging_steps=2 --data.eval_fraction=0.25 --train.eval_interval=3 \
    --output.consolidate=true
must_succeed a
log=$tmp/a.log out=$tmp/out

# --- the resolved block and the two files ------------------------------------------------------
grep -q 'fsdpd node 0: job train: defaults="fsdpd" type="lora"\* global_batch=12\* micro_batch=3\*' "$log" ||
    { cat "$log"; fail "no resolved train section with its set keys marked"; }
grep -q 'job runtime: .*log_every=2\*' "$log" || fail "runtime.log_every is not in the resolved block"
grep -q 'job fsdp: sharding="full_shard" activation_checkpointing="none" ' "$log" ||
    fail "the defaults are marked as set"
grep -q "micro-batch 3 x accumulation 2 x 2 ranks = global batch 12 sequences, 240 tokens a step" "$log" ||
    fail "no batch line"
# the small model: 28332 parameters; rank-4 adapters on its 7 linears of 2 layers: 4656
grep -q "parameters: 4656 trainable of 28332" "$log" || fail "no parameter counts"
grep -q "targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" "$log" || fail "no targets"
[ "$(grep -n 'the job as resolved (a' "$log" | cut -d: -f1)" -lt "$(grep -n 'model in shared memory' "$log" | cut -d: -f1)" ] ||
    fail "the resolved block comes after the model loads"
python3 - "$out/run.json" "$out/job.json" <<'EOF' || fail "run.json or job.json is wrong"
import json, sys
r = json.load(open(sys.argv[1])); j = json.load(open(sys.argv[2]))
assert r["global_batch"] == r["micro_batch"] * r["grad_accum"] * r["world_size"] == 12, r
assert (r["trainable_params"], r["total_params"], r["lora_rank"]) == (4656, 28332, 4), r
assert r["lora_targets"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
assert r["fsdpd_version"] and r["started"] > 0
assert j["train"]["type"] == "lora" and j["runtime"]["log_every"] == 2 and j["lora"]["rank"] == 4
EOF
"$fsdpctl" plan "$out/job.json" > "$tmp/plan.out" || { cat "$tmp/plan.out"; fail "fsdpctl plan refuses job.json"; }
"$fsdpctl" plan "$tmp/job.json" --logging_steps=2 --data.eval_fraction=0.25 --train.eval_interval=3 \
    --output.consolidate=true --runtime.metrics="$tmp/a.jsonl" > "$tmp/plan0.out"
cmp -s <(sed 1d "$tmp/plan.out") <(sed 1d "$tmp/plan0.out") || fail "job.json plans otherwise than the job"

# --- step lines against the metrics ------------------------------------------------------------
grep '^step ' "$log" > "$tmp/steps"
[ "$(cut -d' ' -f2 "$tmp/steps" | tr '\n' ' ')" = "2/6 3/6 4/6 6/6 " ] ||
    { cat "$tmp/steps"; fail "step lines not every 2 steps (with the eval step 3 and the last)"; }
python3 - "$tmp/steps" "$tmp/a.jsonl" <<'EOF' || fail "step lines disagree with the metrics"
import json, re, sys
m = {}
for line in open(sys.argv[2]):
    x = json.loads(line); m[x["step"]] = x
def secs(t):
    h = re.match(r"(?:(\d+)h)?(?:(\d+)m)?(\d+)s$", t)
    return int(h.group(1) or 0) * 3600 + int(h.group(2) or 0) * 60 + int(h.group(3))
for line in open(sys.argv[1]):
    f = re.match(r"step (\d+)/(\d+)  loss \S+  lr \S+  grad_norm \S+  (\d+) tokens/s  tokens (\d+)/(\d+)"
                 r"  elapsed (\S+)  eta (\S+)$", line)
    assert f, line
    step, total = int(f.group(1)), int(f.group(2))
    x = m[step]
    assert abs(int(f.group(3)) - x["tokens"] / x["seconds"]) <= 1, (line, x)
    assert int(f.group(4)) == x["tokens"] and int(f.group(5)) == 240, line
    recent = [m[s]["seconds"] for s in range(max(1, step - 15), step + 1)]
    eta = sum(recent) / len(recent) * (total - step)
    assert abs(secs(f.group(7)) - eta) <= 0.51, (line, eta)
    assert secs(f.group(6)) >= int(sum(m[s]["seconds"] for s in range(1, step + 1))), line
print("step lines agree with the metrics")
EOF

# --- the summary against the metrics -----------------------------------------------------------
grep -q "summary: 6 steps" "$log" || fail "no summary"
grep -q 'load it with PeftModel.from_pretrained(base, "'"$out"'")' "$log" || fail "no line to load the adapter"
python3 - "$out/run.json" "$tmp/a.jsonl" "$log" <<'EOF' || fail "the summary disagrees with the metrics"
import json, sys
r = json.load(open(sys.argv[1]))["summary"]
m = [json.loads(l) for l in open(sys.argv[2])]
assert r["steps"] == m[-1]["step"] == 6 and r["tokens"] == m[-1]["tokens_seen"], r
tps = sum(x["tokens"] for x in m) / sum(x["seconds"] for x in m)
assert abs(r["tokens_per_s"] - tps) <= 1e-6 * tps, (r["tokens_per_s"], tps)
evals = [(x["step"], x["eval_loss"]) for x in m if "eval_loss" in x]
assert len(evals) >= 2 and r["final_eval_loss"] == evals[-1][1], (r, evals)
best = min(evals, key=lambda e: e[1])
assert (r["best_eval_step"], r["best_eval_loss"]) == best, (r, best)
assert r["checkpoints"] == ["step-000003", "step-000006"] and r["adapter"] and r["mfu"] is None, r
assert r["tokens_computed"] == 6 * 240 and r["wall_s"] >= sum(x["seconds"] for x in m)
assert "summary: %d steps, %d tokens" % (r["steps"], r["tokens"]) in open(sys.argv[3]).read()
EOF

# --- status of the finished job ----------------------------------------------------------------
expect_status 0 "finished" "$fsdpctl" status --output "$out"
grep -q "^steps 6, tokens $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["tokens"])' "$out/run.json")," \
    "$tmp/cmd.out" || { cat "$tmp/cmd.out"; fail "status --output does not show the summary"; }
job_id=$(sed -n 's/.*status socket .* (job \([^)]*\)).*/\1/p' "$log")
"$fsdpctl" status --job-id "$job_id" > "$tmp/byid.out" 2>&1 || { cat "$tmp/byid.out"; fail "status --job-id of the ended job"; }
grep -q "finished" "$tmp/byid.out" && grep -q "load: PeftModel.from_pretrained" "$tmp/byid.out" ||
    { cat "$tmp/byid.out"; fail "status --job-id does not report the finished job"; }
expect_error 1 "no job answers" "$fsdpctl" status --job-id local-1

# --- a resumed run: its start marked in the plot; no eval panel without eval -------------------
run_job b -- --train.max_steps=3 --checkpoint.dir="$tmp/ck2" --output.dir="$tmp/out2" --runtime.metrics="$tmp/b.jsonl"
must_succeed b
run_job c -- --train.max_steps=6 --checkpoint.dir="$tmp/ck2" --output.dir="$tmp/out2" --runtime.metrics="$tmp/b.jsonl" \
    --checkpoint.resume=latest
must_succeed c
grep -q "resume: $tmp/ck2/step-000003" "$tmp/c.log" || { cat "$tmp/c.log"; fail "the resume source is not logged"; }
expect_status 0 "1 run start marked" "$fsdpctl" plot "$tmp/b.jsonl" --out "$tmp/b.svg"
python3 - "$tmp/b.svg" <<'EOF' || fail "the plot does not mark the resume at step 3"
import sys, xml.etree.ElementTree as ET
svg = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
marks = [l for l in root.iter(svg + "line") if l.get("class") == "marker"]
assert marks and all(l.get("data-step") == "3" and l.get("data-kind") == "resume" for l in marks), marks
series = sorted(p.get("data-series") for p in root.iter(svg + "polyline"))
assert series == ["loss", "lr", "tokens_per_s"], series
# the marker's x is step 3's on the step axis of the loss line (its 3rd point)
loss = next(p for p in root.iter(svg + "polyline") if p.get("data-series") == "loss").get("points").split()
assert abs(float(marks[0].get("x1")) - float(loss[2].split(",")[0])) < 0.01, (marks[0].get("x1"), loss[2])
assert "no data" not in ET.tostring(root, encoding="unicode")
EOF
echo "resolved block, step lines, summary, status and plot markers as expected"
