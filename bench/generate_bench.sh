#!/usr/bin/env bash
# fsdpctl generate on one GPU (F41): (1) greedy on the golden tiny model against transformers'
# float64 generate (generate_expected.json) on the CUDA backend (bf16), compared up to the
# first step whose margin (best minus second logit) is below MARGIN (bf16 logits are ~1e-2
# off: default 2e-2); (2) tokens/s of Llama-2-7B bf16 (a random init, as transformers loads
# it too) at batch 1 and 16, beside transformers' generate on the same GPU in the same call
# (bench/generate_peer.py, torch + transformers), same prompts (PROMPT_LEN random ids), NEW_TOKENS
# new tokens each, no early EOS; and how many of the first 32 greedy tokens of each prompt the two
# agree on (bf16 on both sides: a near tie may go either way, and the rest follows).
#   bench/generate_bench.sh BUILD
# BUILD holds fsdpctl built with CUDA.  BACKEND=cpu MODEL=configs/models/tiny.json SKIP_PEER=1
# runs the script's logic on a CPU.  Exit status 1 when a step fails.
set -u
build=${1:-build}
backend=${BACKEND:-cuda} model=${MODEL:-configs/models/llama2-7b.json}
new=${NEW_TOKENS:-128} prompt_len=${PROMPT_LEN:-128} batches=${BATCHES:-1 16}
golden=${GOLDEN:-tests/fixtures/golden/tiny-mha} margin=${MARGIN:-2e-2}
fsdpctl=$build/fsdpctl
work=$(mktemp -d /tmp/fsdp-generate.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0

echo "--- greedy on the golden model ($backend) against transformers' generate (float64)"
args=()
for p in $(python3 -c "import json,sys; [print(','.join(map(str, c['prompt']))) for c in json.load(open(sys.argv[1]))['cases']]" "$golden/generate_expected.json"); do
    args+=(--prompt-ids "${p//,/ }")
done
if "$fsdpctl" generate "$golden" --backend "$backend" "${args[@]}" --max-new-tokens 24 --batch 3 --json > "$work/golden.jsonl" 2> "$work/golden.err"; then
    python3 - "$golden/generate_expected.json" "$work/golden.jsonl" "$margin" <<'PY' || failed=1
import json, sys
want = json.load(open(sys.argv[1]))["cases"]
replies = {e["prompt"]: e["ids"] for e in map(json.loads, open(sys.argv[2])) if e["event"] == "reply"}
tol, bad, before, equal = float(sys.argv[3]), 0, 0, 0
for i, c in enumerate(want):
    got = replies[i]
    equal += sum(a == b for a, b in zip(got, c["new_tokens"]))
    for t, (a, b) in enumerate(zip(got, c["new_tokens"])):
        if c["margins"][t] < tol:
            break
        if a != b:
            print(f"case {i} token {t}: {a}, transformers {b} (margin {c['margins'][t]:.3g})"); bad += 1
            break
        before += 1
print(f"golden greedy: {before} tokens compared before each case's first margin below {tol:g}: "
      f"{'all equal' if not bad else str(bad) + ' case(s) differ'}; {equal} of 72 equal overall")
sys.exit(1 if bad else 0)
PY
else
    tail -3 "$work/golden.err"; echo "golden: fsdpctl generate failed"; failed=1
fi

echo "--- tokens/s: $model bf16, $prompt_len-token prompts, $new new tokens each"
if ! "$fsdpctl" init --model-config "$model" --out "$work/model" --dtype bf16 --seed 1 > "$work/init.log" 2>&1; then
    tail -3 "$work/init.log"; echo "fsdpctl init failed"; exit 1
fi
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$work/model/config.json")
for B in $batches; do
    python3 -c "import json,random,sys; r=random.Random(41); B,L,V=map(int,sys.argv[1:4]); json.dump([[r.randrange(3,V) for _ in range(L)] for _ in range(B)], open(sys.argv[4],'w'))" \
        "$B" "$prompt_len" "$vocab" "$work/prompts$B.json"
    pargs=()
    while read -r line; do pargs+=(--prompt-ids "$line"); done < <(python3 -c "import json,sys; [print(' '.join(map(str,p))) for p in json.load(open(sys.argv[1]))]" "$work/prompts$B.json")
    if "$fsdpctl" generate "$work/model" --backend "$backend" "${pargs[@]}" --max-new-tokens "$new" --ignore-eos \
        --batch "$B" --json > "$work/ours$B.jsonl" 2> "$work/ours$B.err"; then
        echo "batch $B: fsdpctl generate: $(grep -o '[0-9.]* tokens/s.*' "$work/ours$B.err") ($(grep -o 'in [0-9.]* s' "$work/ours$B.err"))"
    else
        tail -3 "$work/ours$B.err"; echo "batch $B: fsdpctl generate failed"; failed=1; continue
    fi
    [ -n "${SKIP_PEER:-}" ] && continue
    if python3 bench/generate_peer.py "$work/model" "$work/prompts$B.json" "$new" > "$work/peer$B.json" 2> "$work/peer$B.err"; then
        python3 - "$work/peer$B.json" "$work/ours$B.jsonl" "$B" <<'PY'
import json, sys
peer = json.load(open(sys.argv[1]))
ours = {e["prompt"]: e["ids"] for e in map(json.loads, open(sys.argv[2])) if e["event"] == "reply"}
agree = []
for i, p in enumerate(peer["ids"]):
    n = 0
    while n < min(32, len(p), len(ours[i])) and p[n] == ours[i][n]: n += 1
    agree.append(n)
print(f"batch {sys.argv[3]}: transformers generate: {peer['tokens_per_s']:.1f} tokens/s (in {peer['seconds']:.3f} s, "
      f"peak allocated {peer['peak_mem_gib']:.1f} GiB); first greedy tokens equal to ours: {agree} (of 32)")
PY
    else
        tail -3 "$work/peer$B.err"; echo "batch $B: the peer failed"; failed=1
    fi
done
exit $failed
