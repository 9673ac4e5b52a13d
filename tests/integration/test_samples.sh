#!/usr/bin/env bash
# Samples during training (F41, train.sample_prompts): a tiny CPU full fine-tune of a random
# init on chat data, with chat and plain prompts.  samples.jsonl holds each prompt's greedy
# reply at each evaluation (train.eval_interval and the end), with its fields; the replies at
# the last step are exactly `fsdpctl generate --greedy` of the consolidated output (f32, so the
# same weights); 1 and 2 workers give the same replies; train.sample_every and "no evaluation:
# at the end"; LoRA and QLoRA jobs (= fsdpctl generate --adapter [--quant nf4]); bad prompts
# files and keys refused before any worker starts.
source "$(dirname "$0")/lib.sh"

mkdir -p "$tmp/rand"
sed 's/"num_hidden_layers": 4/"num_hidden_layers": 2/; s/"hidden_size": 256/"hidden_size": 64/; s/"intermediate_size": 688/"intermediate_size": 128/; s/"head_dim": 32/"head_dim": 16/' \
    configs/models/tiny-sp32k/config.json > "$tmp/rand/config.json"
cp "$fixtures/tokenizers/sp32k-tokenizer.json" "$tmp/rand/tokenizer.json"
python3 - "$tmp/chat.jsonl" <<'PY' # 40 short conversations to train on
import json, sys
with open(sys.argv[1], "w") as out:
    for i in range(40):
        a, b = i % 7, i % 5
        out.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                           {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}) + "\n")
PY
{
    head -2 "$fixtures/data/chat.jsonl" # a chat (its reply taken off), a multi-turn chat
    echo '{"prompt": "What is 2 + 3?"}'
    echo '{"text": "Once upon a time"}'
} > "$tmp/prompts.jsonl"

job() { # NAME WORKERS ARGS...: 4 steps, samples of 6 new tokens
    local name=$1 workers=$2
    shift 2
    timeout 300 "$fsdpd" --job configs/jobs/tiny-chat.json --model.config="$tmp/rand/config.json" \
        --data.path="$tmp/chat.jsonl" --data.seq_len=64 --train.max_steps=4 --train.warmup_steps=1 \
        --train.lr=1e-4 --train.min_lr=0 --train.global_batch=4 --train.micro_batch=2 --train.sample_prompts="$tmp/prompts.jsonl" \
        --train.sample_max_new_tokens=6 --runtime.workers_per_node="$workers" --output.dtype=f32 \
        --checkpoint.dir="$tmp/$name.ckpt" --checkpoint.resume=never --output.dir="$tmp/$name" "$@" \
        > "$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log"; fail "$name: fsdpd failed"; }
}
job two 2 --data.eval_fraction=0.1 --train.eval_interval=2
job one 1 --data.eval_fraction=0.1 --train.eval_interval=2
job every 1 --train.sample_every=3
job end 1
# Adapters on the full job's output: each layer's adapters merged into a copy of its gathered
# (for QLoRA dequantized) base.
adapters="--model.path=$tmp/two --model.init= --model.config= --lora.rank=4 --lora.alpha=8 --train.lr=3e-3"
job lora 2 $adapters --train.type=lora
job qlora 2 $adapters --train.type=qlora

python3 - "$tmp" <<'PY' || fail "samples.jsonl"
import json, sys
tmp = sys.argv[1]
def read(name):
    return [json.loads(l) for l in open(f"{tmp}/{name}/samples.jsonl")]
two, one = read("two"), read("one")
keys = {"step", "prompt_index", "prompt", "prompt_ids", "reply", "reply_ids", "stop", "time"}
for s in two:
    assert set(s) == keys, sorted(s)
    assert s["reply_ids"] and all(isinstance(i, int) for i in s["reply_ids"]), s
    assert s["stop"] in ("stop", "length"), s
    assert len(s["reply_ids"]) == 6 or s["stop"] == "stop", s
    assert isinstance(s["reply"], str) and isinstance(s["prompt"], str), s
got = sorted((s["step"], s["prompt_index"]) for s in two)
assert got == [(st, i) for st in (2, 4) for i in range(4)], got
p = {s["prompt_index"]: s for s in two}
assert p[0]["prompt"] == "<s> [INST] What is 3 + 4? [/INST]", p[0]["prompt"]
assert "Answer in one word." in p[1]["prompt"] and "And grass?" in p[1]["prompt"], p[1]["prompt"]
assert p[2]["prompt"] == "<s> What is 2 + 3?", p[2]["prompt"]
assert p[3]["prompt_ids"][0] == 1 and p[3]["prompt"] == "<s> Once upon a time", p[3]["prompt"]
key = lambda r: sorted((s["step"], s["prompt_index"], s["reply_ids"]) for s in r)
assert key(one) == key(two), f"1 worker:\n{key(one)}\n2 workers:\n{key(two)}"
assert len({tuple(s["reply_ids"]) for s in two if s["step"] == 4}) > 1, "every prompt got the same reply"
every = sorted({s["step"] for s in read("every")})
assert every == [3, 4], every
end = sorted({s["step"] for s in read("end")})
assert end == [4], end
final = [s["reply_ids"] for s in sorted(two, key=lambda s: s["prompt_index"]) if s["step"] == 4]
for name in ("two", "lora", "qlora"): # the final replies, for fsdpctl generate
    r = sorted(read(name), key=lambda s: s["prompt_index"])
    if name != "two":
        assert sorted({s["step"] for s in r}) == [4], name
        assert [s["reply_ids"] for s in r] != final, f"{name}: the adapters changed no reply"
    with open(f"{tmp}/{name}.last", "w") as out:
        for s in r:
            if s["step"] == 4: out.write(" ".join(map(str, s["prompt_ids"])) + "\t" + " ".join(map(str, s["reply_ids"])) + "\n")
print(f"samples.jsonl: {len(two)} samples at steps 2 and 4, 1 worker = 2 workers; sample_every 3: {every}; no eval: {end}")
PY
grep -q 'sample after step 4, prompt 3' "$tmp/two.log" || fail "the log has no sample line"

# The last samples are fsdpctl generate --greedy of the consolidated output, id for id.
same_as_generate() { # NAME GENERATE_ARGS...
    local name=$1
    shift
    while IFS=$'\t' read -r prompt reply; do
        "$fsdpctl" generate "$@" --prompt-ids "$prompt" --greedy --max-new-tokens 6 --json 2> /dev/null |
        python3 -c 'import json, sys
want = sys.argv[1]
got = [json.loads(l) for l in sys.stdin if "\"reply\"" in l]
assert len(got) == 1, got
ids = " ".join(map(str, got[0]["ids"]))
assert ids == want, f"fsdpctl generate: {ids}, the sample: {want}"' "$reply" || fail "$name, prompt $prompt: the sample is not fsdpctl generate's reply"
    done < "$tmp/$name.last"
}
same_as_generate two "$tmp/two"
same_as_generate lora "$tmp/two" --adapter "$tmp/lora"
same_as_generate qlora "$tmp/two" --adapter "$tmp/qlora" --quant nf4

# Bad input: refused by fsdpd before any worker starts.
bad() { # NEEDLE ARGS...
    local needle=$1
    shift
    expect_error 2 "$needle" "$fsdpd" --job configs/jobs/tiny-chat.json --model.config="$tmp/rand/config.json" \
        --data.path="$tmp/chat.jsonl" --data.seq_len=64 --train.max_steps=1 --train.warmup_steps=0 --checkpoint.dir="$tmp/bad.ckpt" \
        --output.dir="$tmp/bad" "$@"
    if grep -q "rank 0" "$tmp/cmd.err"; then fail "a worker started for a bad job ($needle)"; fi
}
bad "train.sample_prompts: $tmp/none.jsonl" --train.sample_prompts="$tmp/none.jsonl"
printf '{"prompt": "fine"}\n{"instruction": "x", "output": "y"}\n' > "$tmp/badline.jsonl"
bad "train.sample_prompts: $tmp/badline.jsonl: line 2: not a prompt" --train.sample_prompts="$tmp/badline.jsonl"
printf '%s\n' "not json" > "$tmp/notjson.jsonl"
bad "line 1: not a prompt" --train.sample_prompts="$tmp/notjson.jsonl"
python3 -c 'import json; print(json.dumps({"prompt": "one two three " * 40}))' > "$tmp/long.jsonl"
bad "line 1: the prompt has" --train.sample_prompts="$tmp/long.jsonl"
python3 -c 'import json; print(json.dumps({"messages": [{"role": "user", "content": "one two three " * 40}]}))' > "$tmp/longchat.jsonl"
bad "line 1:" --train.sample_prompts="$tmp/longchat.jsonl"
: > "$tmp/empty.jsonl"
bad "no prompts" --train.sample_prompts="$tmp/empty.jsonl"
bad "train.sample_every: 2 is set but train.sample_prompts is not" --train.sample_every=2
echo "samples during training: samples.jsonl at each eval, = fsdpctl generate of the output, 1 = 2 workers, bad input refused"
