#!/usr/bin/env bash
# runtime.log_to tensorboard (F42): the event files fsdpd writes in OUTPUT_DIR/tensorboard/,
# read back with the tensorboard package's own reader (EventAccumulator, from the venv), hold
# every step's scalars exactly as metrics.jsonl has them (as float32), across a restart inside
# one launch and a resume in a second launch: one file per run, TensorBoard dropping the steps
# a later run repeats (its SessionLog START); the resolved job as the text summary "job" (the
# text plugin's), equal to OUTPUT_DIR/job.json; written as the steps come (read mid-run). A
# tensorboard directory that cannot be written fails the job at start; wandb is refused with the
# wandb sync recipe.
source "$(dirname "$0")/lib.sh"
use_venv tensorboard==2.21.0
make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--runtime.log_to=tensorboard,stdout --data.eval_fraction=0.25 --train.eval_interval=2 --train.max_steps=8
        --checkpoint.interval_steps=2 --checkpoint.async=false --output.consolidate=false)

# A launch whose rank 1 dies at step 5 twice (the run and its restart: the fault fires again),
# then a second launch that resumes from step 4 and completes.
FSDP_FAULTS="worker=1:exit:5" "$fsdpd" --job "$tmp/job.json" "${common[@]}" --checkpoint.resume=never \
    --runtime.max_restarts=1 > "$tmp/a.log" 2>&1 && fail "the run with a dying rank exited 0"
grep -q "restart 1 of 1" "$tmp/a.log" || { cat "$tmp/a.log"; fail "no restart"; }
"$fsdpd" --job "$tmp/job.json" "${common[@]}" --checkpoint.resume=auto > "$tmp/b.log" 2>&1 ||
    { cat "$tmp/b.log"; fail "the resume failed"; }
grep -q "TensorBoard events in $tmp/out/tensorboard/events.out.tfevents" "$tmp/b.log" || { cat "$tmp/b.log"; fail "the event file is not logged"; }
[ "$(ls "$tmp/out/tensorboard" | wc -l)" -eq 3 ] || { ls -l "$tmp/out/tensorboard"; fail "not one event file per run"; }

"$venv/bin/python" - "$tmp/out/tensorboard" "$tmp/out/metrics.jsonl" "$tmp/out/job.json" <<'EOF' || fail "the event files do not hold the metrics"
import json, os, struct, sys
from tensorboard.backend.event_processing import event_accumulator as ea

tb_dir, metrics, job = sys.argv[1:]
files = sorted(os.listdir(tb_dir))
assert [f.rsplit(".", 1)[1] for f in files] == ["0", "1", "0"], files  # fsdpd's restart number
acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
assert acc.file_version == 2.0, acc.file_version
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
lines = [json.loads(l) for l in open(metrics)]
assert [l.get("run_start", {}).get("kind") for l in lines if "run_start" in l] == ["start", "restart", "resume"], lines
last = {}  # a step a later run repeats: the later run's line, as TensorBoard keeps it
for l in lines:
    last[l["step"]] = l
assert sorted(last) == list(range(1, 9)), sorted(last)
want = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm", "memory/bytes": "mem_bytes",
        "memory/peak_bytes": "mem_peak_bytes"}
tags = acc.Tags()["scalars"]
assert sorted(tags) == sorted(list(want) + ["train/tokens_per_s", "eval/loss"]), tags
for tag in tags:
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    if tag == "eval/loss":
        exp = [(s, f32(l["eval_loss"])) for s, l in sorted(last.items()) if "eval_loss" in l]
        assert [s for s, _ in exp] == [2, 4, 6, 8], exp
    elif tag == "train/tokens_per_s":
        exp = [(s, f32(l["tokens"] / l["seconds"])) for s, l in sorted(last.items())]
    else:
        exp = [(s, f32(l[want[tag]])) for s, l in sorted(last.items())]
    assert got == exp, (tag, got, exp)
assert acc.PluginTagToContent("text") == {"job": b""}
texts = acc.Tensors("job")
t = texts[-1].tensor_proto
assert t.dtype == 7 and len(t.tensor_shape.dim) == 0, t  # DT_STRING, a scalar
text = t.string_val[0].decode()
assert text.startswith("```json\n") and text.endswith("\n```"), text[:40]
assert json.loads(text[8:-4]) == json.load(open(job)), "the text summary is not job.json"
assert texts[-1].step == 5, texts[-1].step  # the resume's first step
print("ok: %d steps, %d tags" % (len(last), len(tags)))
EOF

# Written as the steps come: mid-run (step_delay), TensorBoard reads every step metrics.jsonl
# has so far.
FSDP_FAULTS="step_delay=0:0.3" "$fsdpd" --job "$tmp/job.json" --runtime.log_to=tensorboard --train.max_steps=12 \
    --output.dir="$tmp/live" --checkpoint.dir="$tmp/live.ckpt" --checkpoint.resume=never > "$tmp/live.log" 2>&1 &
job=$!
bg_pids+=("$job")
three_steps() { [ -f "$tmp/live/metrics.jsonl" ] && [ "$(wc -l < "$tmp/live/metrics.jsonl")" -ge 3 ]; }
wait_for 60 three_steps
seen=$(wc -l < "$tmp/live/metrics.jsonl")
"$venv/bin/python" - "$tmp/live/tensorboard" "$seen" <<'EOF' || fail "the event file lags behind metrics.jsonl mid-run"
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
steps = [e.step for e in acc.Scalars("train/loss")]
assert steps and steps[-1] >= int(sys.argv[2]) and steps[-1] < 12, (steps, sys.argv[2])
EOF
wait "$job" || { cat "$tmp/live.log"; fail "the live job failed"; }

# The directory cannot be made (a file is in its place): an error at start, before any worker.
mkdir -p "$tmp/bad"
touch "$tmp/bad/tensorboard"
expect_error 1 "runtime.log_to tensorboard" "$fsdpd" --job "$tmp/job.json" --runtime.log_to=tensorboard \
    --output.dir="$tmp/bad" --checkpoint.dir="$tmp/bad.ckpt" --checkpoint.resume=never
! grep -q "rank 0: started" "$tmp/cmd.err" || fail "workers started although the event file cannot be written"

# wandb: refused, with the recipe that gets the same curves into W&B.
expect_error 2 "wandb sync --sync-tensorboard OUTPUT_DIR/tensorboard" "$fsdpd" --job "$tmp/job.json" --runtime.log_to=wandb
echo "PASS: tensorboard"
