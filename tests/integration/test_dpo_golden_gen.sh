#!/usr/bin/env bash
# The DPO golden's generator (tests/golden_gen/dpo_golden.py) without torch: its numpy float64
# formula path (a Llama forward with a hand-written backward, the DPO and ORPO losses, AdamW)
# with the committed adapter init, against the committed golden (tests/fixtures/dpo) through
# compare_dpo_golden.py at 1e-5: the batch (exactly), every case's `formula` figures (step 1 and
# after the AdamW step), the logps tensors, cdpo's loss and gradients.  Then the formula
# gradients of the TRL cases against TRL's, 2e-6 (the golden's own trl_vs_formula is 7.5e-7),
# and the comparer failing on a golden that differs.
source "$(dirname "$0")/lib.sh"
pref=$(fixture dpo) || exit 1
use_venv safetensors numpy
py=$venv/bin/python
"$py" tests/golden_gen/dpo_golden.py --formula-only --lora-init "$pref/dpo_golden.safetensors" --out "$tmp/gen" \
    > "$tmp/gen.log" 2>&1 || { cat "$tmp/gen.log"; fail "dpo_golden.py --formula-only failed"; }
"$py" tests/golden_gen/compare_dpo_golden.py --only-common "$pref" "$tmp/gen" > "$tmp/cmp.log" 2>&1 ||
    { grep -v '^ok' "$tmp/cmp.log"; fail "the formula path differs from the committed golden"; }
n=$(grep -c '^ok   figure cases\.[a-z_]*\.formula\.' "$tmp/cmp.log")
[ "$n" -ge 100 ] || { cat "$tmp/cmp.log"; fail "only $n formula figures compared"; }
grep -qE '^ok   tensor lora_dpo_cdpo\.grad\.' "$tmp/cmp.log" || fail "cdpo's gradients not compared"

"$py" - "$pref/dpo_golden.safetensors" <<'PY' || fail "formula gradients against TRL's"
import sys
sys.path.insert(0, "tests/golden_gen")
import dpo_golden as G
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
init = {k[len("lora_init."):]: v for k, v in t.items() if k.startswith("lora_init.")}
batch = G.formula_batch(G.build_pairs())
weights = G.load_model_weights()
for name, case in G.CASES:
    if case.get("formula_only"):
        continue
    fc = G.formula_case(weights, init, batch, case)
    keys = [k for k in t if k.startswith(name + ".grad.")]
    assert sorted(k[len(name) + 6:] for k in keys) == sorted(fc["grads"]), name
    worst = max(G.rel(fc["grads"][k[len(name) + 6:]], t[k]) for k in keys)
    assert worst < 2e-6, (name, worst)
    print(name, "formula vs TRL gradients", worst)
PY

# A golden that differs (one gradient scaled by 1 + 1e-4, one formula figure moved): exit 1, named.
cp -r "$pref" "$tmp/bad"
"$py" - "$tmp/bad" <<'PY'
import json, sys
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
t = load_file(d + "/dpo_golden.safetensors")
k = "lora_dpo_cdpo.grad.model.layers.0.self_attn.q_proj.lora_A.default.weight"
t[k] = t[k] * (1 + 1e-4)
save_file(t, d + "/dpo_golden.safetensors")
j = json.load(open(d + "/dpo_golden.json"))
j["cases"]["full_orpo"]["formula"]["step2"]["loss"] *= 1 + 1e-3
json.dump(j, open(d + "/dpo_golden.json", "w"))
PY
"$py" tests/golden_gen/compare_dpo_golden.py --only-common "$tmp/bad" "$tmp/gen" > "$tmp/bad.log" 2>&1 &&
    fail "the comparer passed a golden that differs"
grep -q '^FAIL tensor lora_dpo_cdpo.grad.model.layers.0.self_attn.q_proj.lora_A' "$tmp/bad.log" || fail "the gradient not named"
grep -q '^FAIL figure cases.full_orpo.formula.step2.loss' "$tmp/bad.log" || fail "the figure not named"
"$py" tests/golden_gen/compare_dpo_golden.py "$pref" "$tmp/gen" > "$tmp/all.log" 2>&1 &&
    fail "without --only-common, a golden lacking TRL's figures passed"
grep -q '^MISSING figure cases.lora_dpo_sigmoid.loss' "$tmp/all.log" || fail "the missing figure not named"
echo "tests/golden_gen: the formula path reproduces the committed DPO golden; the comparer fails on differences"
