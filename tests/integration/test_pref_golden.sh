#!/usr/bin/env bash
# Preference tuning through fsdpd (F49) against TRL's golden (tests/fixtures/dpo, TRL 1.16.0's
# DPOTrainer and ORPOTrainer on tests/fixtures/golden/tiny-mha): the golden's batch of 4 pairs as a
# cache of pairs (fsdpctl tokenize --from-safetensors --pairs), LoRA r 8, alpha 16 on q_proj
# and v_proj from the golden's init (lora.init_from) or the whole model, at 1 and 2 workers
# and micro-batches of 1 and 2 pairs (a full DPO's reference: the frozen copy of the start weights):
#  - two steps (AdamW lr 1e-2, betas 0.9/0.95): metrics.jsonl's loss and TRL's metrics
#    (rewards/*, logps/*, ORPO's nll_loss, log_odds_*) of both against the golden, 1e-4 on the CPU
#    (on CUDA a difference, rewards/margins and log_odds_chosen, relative to its two terms);
#  - every gradient: one step with eps 1e6 and lr 1e11 moves each parameter by -1e5 g / (1 +
#    |g| 1e-6), so (start - end) / 1e5 is the gradient (to 1e-6 of it): against the golden's, 1e-4.
#    The final parameters are read back through the compute dtype (bf16 on CUDA): a step that
#    small next to a parameter near 1 (an RMSNorm weight) would leave the readout's rounding,
#    |p| 2^-9 / 100, as the error (4.5e-2 of a norm's gradient), so the step is 1e5 g;
#  - full DPO resumed after step 1: step 2 as the uninterrupted run's (the reference is the start
#    weights again: read from the model files);
#  - refusals: packing, a pairs cache under SFT, SFT data under DPO.
# FSDP_GOLDEN_BACKEND=cuda runs it on the GPU (bf16 compute, fp32 masters) at DESIGN.md's 2e-2.
source "$(dirname "$0")/lib.sh"
golden=$(fixture golden/tiny-mha) || exit 1
pref=$(fixture dpo) || exit 1
backend=${FSDP_GOLDEN_BACKEND:-cpu}
if [ "$backend" = cuda ]; then tol=2e-2; else tol=1e-4; fi
use_venv safetensors numpy

# The golden batch as pairs (rows 2i, 2i+1: TRL's rows i and 4 + i; labels the completion),
# the LoRA init as a PEFT adapter directory (PEFT's saved names: no ".default").
"$venv/bin/python" - "$pref/dpo_golden.safetensors" "$golden/lora/adapter_config.json" "$tmp" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1])
ids, mask = t["batch.input_ids"], t["batch.completion_mask"]
P = ids.shape[0] // 2
order = [r for i in range(P) for r in (i, P + i)]
save_file({"input_ids": ids[order].astype(np.int32),
           "labels": np.where(mask[order] == 1, ids[order], -100).astype(np.int32)}, sys.argv[3] + "/pairs.safetensors")
cfg = json.load(open(sys.argv[2]))
cfg.update(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
import os
os.makedirs(sys.argv[3] + "/init", exist_ok=True)
json.dump(cfg, open(sys.argv[3] + "/init/adapter_config.json", "w"))
save_file({k[len("lora_init."):].replace(".default.weight", ".weight"): v for k, v in t.items()
           if k.startswith("lora_init.")}, sys.argv[3] + "/init/adapter_model.safetensors", metadata={"format": "pt"})
PY
"$fsdpctl" tokenize --from-safetensors "$tmp/pairs.safetensors" --pairs --out "$tmp/pairs.tokens" | grep -q 'in preference pairs' ||
    fail "no cache of pairs"
"$fsdpctl" tokenize --from-safetensors "$tmp/pairs.safetensors" --out "$tmp/rows.tokens" > /dev/null
# --pairs refuses rows that are not pairs: an odd count, a row labelled from its first token
"$venv/bin/python" - "$tmp" <<'PY'
import sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1] + "/pairs.safetensors")
save_file({k: v[:7] for k, v in t.items()}, sys.argv[1] + "/odd.safetensors")
labels = t["labels"].copy()
labels[2, 0] = t["input_ids"][2, 0]
save_file({"input_ids": t["input_ids"], "labels": labels}, sys.argv[1] + "/noprompt.safetensors")
PY
for bad in "odd:pairs need an even count" "noprompt:row 2 has no prompt"; do
    "$fsdpctl" tokenize --from-safetensors "$tmp/${bad%%:*}.safetensors" --pairs --out "$tmp/bad.tokens" > "$tmp/bad.log" 2>&1 &&
        fail "--pairs accepted ${bad%%:*}"
    grep -q "${bad#*:}" "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "--pairs on ${bad%%:*}: no '${bad#*:}'"; }
done

cat > "$tmp/job.json" <<JSON
{
  "model": {"path": "$golden", "dtype": "f32"},
  "data": {"path": "$tmp/pairs.tokens", "format": "tokens", "seq_len": 28, "shuffle": false},
  "train": {"type": "lora", "global_batch": 4, "max_steps": 2, "lr": 1e-2, "schedule": "constant",
            "betas": [0.9, 0.95], "eps": 1e-8, "clip_norm": 0, "objective": "dpo"},
  "lora": {"rank": 8, "alpha": 16, "dropout": 0, "targets": ["q_proj", "v_proj"], "init_from": "$tmp/init"},
  "checkpoint": {"resume": "never", "save_final": false},
  "output": {"consolidate": false},
  "runtime": {"backend": "$backend", "heartbeat_s": 1, "comm_timeout_s": 60}
}
JSON

# run NAME WORKERS MICRO [overrides...]: fsdpd into $tmp/NAME, the final trainable parameters
# in $tmp/NAME.safetensors.
run() {
    local name=$1 workers=$2 micro=$3
    shift 3
    FSDP_FAULTS="final_params=$tmp/$name.safetensors" "$fsdpd" --job "$tmp/job.json" \
        --runtime.workers_per_node="$workers" --train.micro_batch="$micro" \
        --checkpoint.dir="$tmp/$name.ckpt" --output.dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1
}

# off_golden WHAT: a comparison off the golden, counted; every case still runs (what is off
# where is the figure a CUDA run is for), and the test fails at the end.
off=0
off_golden() { echo "FAIL: $*: off the golden" >&2; off=$((off + 1)); }

# check_steps NAME CASE: both steps' loss and metrics against cases.CASE (and its step2).
check_steps() {
    python3 - "$tmp/$1/metrics.jsonl" "$pref/dpo_golden.json" "$2" "$tol" "$backend" <<'PY'
import json, sys
tol = float(sys.argv[4])
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
case = json.load(open(sys.argv[2]))["cases"][sys.argv[3]]
names = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected"]
if case["settings"]["objective"] == "orpo":
    names += ["nll_loss", "log_odds_ratio", "log_odds_chosen"]
# A difference of two near-equal terms (ORPO's margins: -0.5378 - -0.5370) carries their
# rounding, not its own: in bf16 its error is relative to the terms (bf16 logits put 4e-5 of
# the terms into a -8.5e-4 margin, 5% of it).  fp32's rounding (1e-7 of the terms) keeps the
# CPU's check relative to the value itself, where dropping a term of 4e-6 of them shows.
terms = {"rewards/margins": ("rewards/chosen", "rewards/rejected"), "log_odds_chosen": ("logps/chosen", "logps/rejected")}
if sys.argv[5] != "cuda":
    terms = {}
bad = len(steps) != 2
for got, want in zip(steps, [case, case["step2"]]):
    for n in ["loss"] + names:
        m = want if n == "loss" else want["metrics"]
        g, w = got.get(n), m[n]
        scale = max([abs(w), 1e-3] + [abs(m[t]) for t in terms.get(n, ())])
        e = abs(g - w) / scale if g is not None else float("inf")
        if not e <= tol:
            bad = True
            print(f"step {got['step']}: {n} {g!r}, the golden's {w!r} (error {e:.2e})")
    print(f"step {got['step']}: loss {got['loss']:.9f}, golden {want['loss']:.9f}")
sys.exit(1 if bad else 0)
PY
}

# check_grads NAME CASE START: START - NAME's final parameters against CASE's gradients.
check_grads() {
    "$venv/bin/python" - "$tmp/$1.safetensors" "$pref/dpo_golden.safetensors" "$2" "$3" "$tol" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
end, golden, case = load_file(sys.argv[1]), load_file(sys.argv[2]), sys.argv[3]
start, tol = load_file(sys.argv[4]), float(sys.argv[5])
prefix = case + ".grad."
want = {k[len(prefix):]: v for k, v in golden.items() if k.startswith(prefix)}
worst, n, worst_name = 0.0, 0, ""
for name, g in want.items():
    key = "base_model.model." + name.replace(".default.weight", ".weight") if "lora_" in name else name
    d = (start[key].astype(np.float64) - end[key]) / 1e5
    e = np.linalg.norm(d - g) / np.linalg.norm(g)
    if e > worst:
        worst, worst_name = e, name
    n += 1
    if not e <= tol:
        print(f"{case}: gradient {name} off by {e:.2e}")
print(f"{case}: {n} gradients, worst {worst:.2e} ({worst_name})")
sys.exit(0 if worst <= tol and n == len(want) and n > 0 else 1)
PY
}

# --- DPO (sigmoid, robust, ipo) and ORPO with LoRA; ORPO full -----------------------------------
lora_case() { # CASE OVERRIDES...
    local c=$1
    shift
    for wm in 1:2 2:1 2:2; do
        w=${wm%:*} m=${wm#*:}
        run "$c-w$w-m$m" "$w" "$m" "$@" || { cat "$tmp/$c-w$w-m$m.log"; fail "$c at $w workers failed"; }
        echo "--- $c, $w worker(s), micro-batch $m pair(s)"
        check_steps "$c-w$w-m$m" "$c" || off_golden "$c at $w workers, micro-batch $m"
    done
    for w in 1 2; do
        run "$c-g$w" "$w" 1 --train.max_steps=1 --train.lr=1e11 --train.eps=1e6 "$@" ||
            { cat "$tmp/$c-g$w.log"; fail "$c's gradient run at $w workers failed"; }
        check_grads "$c-g$w" "$c" "$tmp/init/adapter_model.safetensors" || off_golden "$c at $w workers: gradients"
    done
}
lora_case lora_dpo_sigmoid
lora_case lora_dpo_robust --train.dpo_loss=robust --train.dpo_label_smoothing=0.1
lora_case lora_dpo_ipo --train.dpo_loss=ipo
lora_case lora_orpo --train.objective=orpo --train.orpo_lambda=0.1

# Full fine-tunes, the base's own tensors where they start: ORPO, and DPO, whose reference is
# the frozen copy of the start weights (step 2 matches the golden only if it stayed frozen).
sed -i 's/"type": "lora", //; /"lora":/d' "$tmp/job.json"
full_case() { # CASE OVERRIDES...
    local c=$1
    shift
    for w in 1 2; do
        run "$c-w$w" "$w" 1 --train.type=full "$@" || { cat "$tmp/$c-w$w.log"; fail "$c at $w workers failed"; }
        echo "--- $c, $w worker(s)"
        check_steps "$c-w$w" "$c" || off_golden "$c at $w workers"
        run "$c-g$w" "$w" 1 --train.type=full "$@" --train.max_steps=1 --train.lr=1e11 --train.eps=1e6 ||
            { cat "$tmp/$c-g$w.log"; fail "$c's gradient run at $w workers failed"; }
        check_grads "$c-g$w" "$c" "$golden/model.safetensors" || off_golden "$c at $w workers: gradients"
    done
}
full_case full_orpo --train.objective=orpo
full_case full_dpo_sigmoid --train.objective=dpo

# Full DPO resumed after step 1 (its reference read from the model files again, as at the
# start): step 2's loss and metrics those of the uninterrupted run.
run full-dpo-first 2 1 --train.type=full --train.objective=dpo --train.max_steps=1 --checkpoint.save_final=true ||
    { cat "$tmp/full-dpo-first.log"; fail "full DPO's first step failed"; }
FSDP_FAULTS="final_params=$tmp/full-dpo-resumed.safetensors" "$fsdpd" --job "$tmp/job.json" \
    --runtime.workers_per_node=2 --train.micro_batch=1 --train.type=full --train.objective=dpo \
    --checkpoint.dir="$tmp/full-dpo-first.ckpt" --checkpoint.resume=auto --output.dir="$tmp/full-dpo-resumed" \
    > "$tmp/full-dpo-resumed.log" 2>&1 || { cat "$tmp/full-dpo-resumed.log"; fail "full DPO's resume failed"; }
grep -q "resuming from $tmp/full-dpo-first.ckpt/step-000001: step 1" "$tmp/full-dpo-resumed.log" ||
    { cat "$tmp/full-dpo-resumed.log"; fail "full DPO did not resume from step 1"; }
[ "$(grep -c . "$tmp/full-dpo-resumed/metrics.jsonl")" -eq 1 ] || fail "the resumed full DPO should run step 2 only"
# the same digits on the CPU; on CUDA within 1e-3 (a reference that were not the start
# weights moves step 2's loss by 3.6%)
python3 - "$tmp/full_dpo_sigmoid-w2/metrics.jsonl" "$tmp/full-dpo-resumed/metrics.jsonl" "$backend" <<'PY' ||
import json, sys
want, got = ([json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[1:3])
want, got = [s for s in want if s["step"] == 2][0], got[0]
tol = 0 if sys.argv[3] == "cpu" else 1e-3
keys = [k for k in want if k == "loss" or k.startswith(("rewards/", "logps/"))]
bad = [f"{k}: {got.get(k)!r}, uninterrupted {want[k]!r}" for k in keys
       if got["step"] != 2 or got.get(k) is None or abs(got[k] - want[k]) > tol * abs(want[k])]
print("\n".join(bad) or f"step 2 loss {got['loss']!r}, uninterrupted {want['loss']!r}")
sys.exit(1 if bad or len(keys) < 7 else 0)
PY
    fail "full DPO resumed after step 1: step 2 is not the uninterrupted run's"
echo "--- full DPO resumed after step 1: step 2 as the uninterrupted run's"

[ "$off" -eq 0 ] || fail "$off comparison(s) off the golden (above)"

# --- refusals -----------------------------------------------------------------------------------
refused() { # NAME PATTERN OVERRIDES...
    local name=$1 pattern=$2
    shift 2
    if run "$name" 1 1 "$@"; then fail "$name was accepted"; fi
    grep -q "$pattern" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no '$pattern'"; }
}
refused packing "packing the pairs of train.objective 'orpo' is not built yet" --train.objective=orpo --data.packing=true
refused sftpairs "a cache of preference pairs, but train.objective is sft" --train.objective=sft
refused dporows "no cache of pairs, but train.objective is a preference" --train.objective=orpo --data.path="$tmp/rows.tokens"
refused betasft "train.dpo_beta: 0.2 is set but train.objective is not dpo" --train.objective=sft --train.dpo_beta=0.2
echo "preference objectives match TRL's golden at 1 and 2 workers"
