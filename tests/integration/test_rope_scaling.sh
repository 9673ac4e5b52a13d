#!/usr/bin/env bash
# RoPE scaling against transformers: for configs with yarn (Qwen2.5's 128k setting, and with
# every optional key), linear and llama3 scaling, the frequencies and the attention factor
# `fsdpctl inspect --rope` gives (what the model uses) match those transformers' own rope
# init functions compute from the same config.json (rope_ref.py), to 1e-6 relative.
source "$(dirname "$0")/lib.sh"
use_venv transformers==5.17.0 numpy

# case NAME BASE JQ_PYTHON: configs/models/BASE with the edit of a Python expression on `c`.
case_dir() {
    mkdir -p "$tmp/$1"
    "$venv/bin/python" - "configs/models/$2" "$tmp/$1/config.json" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
    dirs+=("$tmp/$1")
}
dirs=()
case_dir qwen25-yarn qwen2.5-7b.json \
    'c["rope_scaling"] = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}'
case_dir qwen3-yarn-all qwen3-8b.json \
    'c["rope_scaling"] = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
     "beta_fast": 16, "beta_slow": 2, "truncate": False, "mscale": 0.707, "mscale_all_dim": 1.0}'
case_dir mistral-yarn-af mistral-7b-v0.3.json \
    'c["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0, "attention_factor": 0.8,
     "original_max_position_embeddings": 16384}; del c["rope_theta"]'
case_dir yarn-no-original qwen2.5-14b.json 'c["rope_scaling"] = {"type": "yarn", "factor": 3.0}'
case_dir llama-linear tiny.json 'c["rope_parameters"] = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5}'
case_dir llama3 llama3.1-8b.json 'pass'

"$venv/bin/python" tests/integration/rope_ref.py "${dirs[@]}" > "$tmp/ref.txt" 2> "$tmp/ref.err" ||
    { cat "$tmp/ref.err" >&2; fail "transformers' rope functions failed"; }
for d in "${dirs[@]}"; do
    "$fsdpctl" inspect --rope "$d" | grep -E '^(inv_freq|attention_factor) ' > "$tmp/ours.txt"
    awk -v d="$d" '$1 == "#" { on = $2 == d; next } on' "$tmp/ref.txt" > "$tmp/theirs.txt"
    [ -s "$tmp/theirs.txt" ] || fail "$d: no reference values"
    "$venv/bin/python" - "$tmp/ours.txt" "$tmp/theirs.txt" "${d##*/}" <<'PY' || fail "${d##*/}: RoPE differs from transformers"
import sys
ours, theirs = ([l.split() for l in open(f)] for f in sys.argv[1:3])
bad = len(ours) != len(theirs)
for a, b in zip(ours, theirs):
    if a[:-1] != b[:-1] or abs(float(a[-1]) - float(b[-1])) > 1e-6 * abs(float(b[-1])):
        print(f"{sys.argv[3]}: ours {a}, transformers {b}")
        bad = True
print(f"{sys.argv[3]}: {len(ours)} values{' NOT' if bad else ''} as transformers computes them")
sys.exit(bad)
PY
done
# The check can fail: yarn's attention factor is not 1, and the frequencies are scaled.
grep -q "^attention_factor 1.13862943611198" <("$fsdpctl" inspect --rope "$tmp/qwen25-yarn") ||
    fail "Qwen2.5's yarn attention factor is not 0.1 ln 4 + 1"
grep -q "^inv_freq 63 " <("$fsdpctl" inspect --rope "$tmp/qwen25-yarn") || fail "not 64 frequencies"
case_dir dynamic tiny.json 'c["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}'
expect_status 1 'rope_parameters.rope_type "dynamic" is not supported' "$fsdpctl" inspect --rope "$tmp/dynamic"
echo "rope scaling: ok"
