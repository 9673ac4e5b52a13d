#!/usr/bin/env bash
# fsdpctl generate (F41): greedy on the golden model against transformers' generate
# (generate_expected.json; the near tie handled as its README says), batched and one at a time;
# --json's events; a stop id; seeded sampling reproducible; --adapter against the model
# fsdpctl merge writes; --quant nf4; --prompt and --chat prompts against transformers'
# apply_chat_template(add_generation_prompt=True) and tokenizers for the llama2, llama3 and
# chatml templates; and the bad input: a prompt past max_position_embeddings, an adapter for
# another base, an unknown stop string, a temperature <= 0 with sampling.
source "$(dirname "$0")/lib.sh"
golden=$fixtures/golden/tiny-mha
gen() { "$fsdpctl" generate "$@"; }

# --- greedy against transformers ----------------------------------------------------------
args=()
for p in $(python3 -c "import json,sys; [print(','.join(map(str, c['prompt']))) for c in json.load(open(sys.argv[1]))['cases']]" "$golden/generate_expected.json"); do
    args+=(--prompt-ids "${p//,/ }")
done
for batch in 1 3; do
    gen "$golden" "${args[@]}" --max-new-tokens 24 --batch $batch --json > "$tmp/greedy$batch.jsonl"
    python3 - "$golden/generate_expected.json" "$tmp/greedy$batch.jsonl" <<'PY' || fail "greedy (--batch $batch) differs from transformers"
import json, sys
want = json.load(open(sys.argv[1]))["cases"]
events = [json.loads(l) for l in open(sys.argv[2])]
replies = {e["prompt"]: e for e in events if e["event"] == "reply"}
tokens = {}
for e in events:
    if e["event"] == "token": tokens.setdefault(e["prompt"], []).append(e["id"])
compared = 0
for i, c in enumerate(want):
    r = replies[i]
    assert r["prompt_ids"] == c["prompt"], (i, r["prompt_ids"])
    assert r["stop"] == "length" and len(r["ids"]) == 24, r
    assert tokens[i] == r["ids"], "token events are not the reply's ids"
    for t, (a, b) in enumerate(zip(r["ids"], c["new_tokens"])):
        if a != b and c["margins"][t] < 1e-4:
            print(f"case {i}: token {t} differs at a near tie (margin {c['margins'][t]:.1e}): compared up to it")
            break
        assert a == b, f"case {i} token {t}: {a}, transformers {b} (margin {c['margins'][t]:.2e})"
        compared += 1
print(f"greedy: {compared} of 72 tokens equal transformers' generate")
PY
done
cmp <(grep reply "$tmp/greedy1.jsonl") <(grep reply "$tmp/greedy3.jsonl") || fail "batched replies differ from one at a time"
gen "$golden" --prompt-ids 115 --max-new-tokens 24 > "$tmp/plain" 2> "$tmp/plain.err"
grep -qx "137 10 188 60 183 149 52 80 125 17 48 42 172 188 205 185 132 132 132 132 132 197 40 171" "$tmp/plain" ||
    fail "one prompt without --json: $(cat "$tmp/plain")"
grep -qF "(24 tokens, stop: length)" "$tmp/plain.err" || fail "no stop reason on stderr"

# --- a stop id ends the reply with it ------------------------------------------------------
gen "$golden" --prompt-ids 115 --stop 60 --json | grep reply > "$tmp/stop"
grep -qF '"ids":[137,10,188,60],"stop":"stop"' "$tmp/stop" || fail "--stop 60: $(cat "$tmp/stop")"

# generation_config.json's eos ids stop a reply (here 60, an id list); --ignore-eos does not
mkdir "$tmp/eos"
for f in config.json model.safetensors; do ln -s "$(realpath "$golden/$f")" "$tmp/eos/$f"; done
echo '{"bos_token_id": 1, "eos_token_id": [7, 60]}' > "$tmp/eos/generation_config.json"
gen "$tmp/eos" --prompt-ids 115 --json | grep reply > "$tmp/eos.out"
grep -qF '"ids":[137,10,188,60],"stop":"stop"' "$tmp/eos.out" || fail "eos from generation_config.json: $(cat "$tmp/eos.out")"
gen "$tmp/eos" --prompt-ids 115 --ignore-eos --max-new-tokens 24 --json | grep reply > "$tmp/eos.out"
grep -qF '"stop":"length"' "$tmp/eos.out" || fail "--ignore-eos: $(cat "$tmp/eos.out")"
echo '{"eos_token_id": "2"}' > "$tmp/eos/generation_config.json"
expect_error 1 "generation_config.json: eos_token_id is not a token id or a list of them" gen "$tmp/eos" --prompt-ids 1

# --- sampling: the same seed the same tokens, another seed others -------------------------
s() { gen "$golden" --prompt-ids "36 21 205" --prompt-ids 115 --temperature 1.5 --top-k 50 --top-p 0.95 --seed "$1" --max-new-tokens 16 --json | grep reply; }
s 5 > "$tmp/s5a"
s 5 > "$tmp/s5b"
s 6 > "$tmp/s6"
cmp -s "$tmp/s5a" "$tmp/s5b" || fail "the same seed sampled different tokens"
cmp -s "$tmp/s5a" "$tmp/s6" && fail "seeds 5 and 6 sampled the same tokens"
grep -q '"stop":"length"' "$tmp/s5a" || fail "sampling: $(cat "$tmp/s5a")"

# --- --adapter: what the merged model says ------------------------------------------------
"$fsdpctl" merge "$golden" "$golden/lora" "$tmp/merged" --dtype f32 > /dev/null
gen "$golden" --adapter "$golden/lora" "${args[@]}" --max-new-tokens 24 --json | grep reply > "$tmp/adapter"
gen "$tmp/merged" "${args[@]}" --max-new-tokens 24 --json | grep reply > "$tmp/merged.out"
cmp -s "$tmp/adapter" "$tmp/merged.out" || fail "--adapter differs from the merged model"
cmp -s "$tmp/adapter" <(grep reply "$tmp/greedy1.jsonl") && fail "--adapter changed nothing"
gen "$golden" --quant nf4 "${args[@]}" --max-new-tokens 24 --json | grep reply > "$tmp/nf4"
[ "$(grep -c '"stop":"length"' "$tmp/nf4")" = 3 ] || fail "--quant nf4: $(cat "$tmp/nf4")"
cmp -s "$tmp/nf4" <(grep reply "$tmp/greedy1.jsonl") && fail "--quant nf4 changed nothing"

# --- bad input ------------------------------------------------------------------------------
expect_error 1 "prompt 0 has 65 tokens, more than the model's max_position_embeddings 64" \
    gen "$golden" --prompt-ids "$(seq -s ' ' 1 65)"
expect_error 1 "--temperature 0: sampling needs a temperature above 0" gen "$golden" --prompt-ids 1 --temperature 0
expect_error 1 "--temperature -1: sampling needs a temperature above 0" gen "$golden" --prompt-ids 1 --temperature -1 --seed 2
expect_error 2 "needs --greedy or sampling" gen "$golden" --prompt-ids 1 --greedy --top-k 3
expect_error 1 "--stop 'foo': unknown stop string" gen "$golden" --prompt-ids 1 --stop foo
expect_error 1 "--stop 999: not a token id of the model (vocabulary 211)" gen "$golden" --prompt-ids 1 --stop 999
expect_error 1 "--prompt-ids '1 211': '211' is not a token id of the model" gen "$golden" --prompt-ids "1 211"
expect_error 2 "fsdpctl generate: --bogus: unknown flag" gen "$golden" --bogus
sed 's/"hidden_size": 64/"hidden_size": 32/; s/"head_dim": 16/"head_dim": 8/; s/"intermediate_size": 172/"intermediate_size": 86/' \
    "$golden/config.json" > "$tmp/other.json"
"$fsdpctl" init --model-config "$tmp/other.json" --out "$tmp/other" > /dev/null
expect_error 1 "--adapter $golden/lora: not an adapter for $tmp/other" gen "$tmp/other" --adapter "$golden/lora" --prompt-ids 1

# --- text prompts and chat templates against transformers -----------------------------------
use_venv "transformers==5.17.0" jinja2 tokenizers
"$venv/bin/python" tests/integration/chat_data_ref.py gen "$tmp"
cat "$fixtures/data/chat.jsonl" >> "$tmp/chat.jsonl"
tiny_model() { # DIR VOCAB TOKENIZER_JSON TOKENIZER_CONFIG [JINJA]
    sed "s/\"vocab_size\": 32000/\"vocab_size\": $2/; s/\"num_hidden_layers\": 4/\"num_hidden_layers\": 1/; s/\"hidden_size\": 256/\"hidden_size\": 64/; s/\"intermediate_size\": 688/\"intermediate_size\": 128/; s/\"head_dim\": 32/\"head_dim\": 16/" \
        configs/models/tiny.json > "$tmp/cfg.json"
    "$fsdpctl" init --model-config "$tmp/cfg.json" --out "$1" > /dev/null
    cp "$3" "$1/tokenizer.json"
    "$venv/bin/python" - "$4" "$1/tokenizer_config.json" "${5:-}" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
if sys.argv[3]: c["chat_template"] = open(sys.argv[3]).read()
json.dump(c, open(sys.argv[2], "w"))
PY
}
printf '%s' "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}" > "$tmp/chatml.jinja"
tiny_model "$tmp/l2" 32000 "$fixtures/tokenizers/sp32k-tokenizer.json" "$fixtures/tokenizers/sp32k-tokenizer_config.json" \
    "$fixtures/tokenizers/llama2-chat_template.jinja"
l3=$(fixture tokenizers/llama3-tokenizer.json)
tiny_model "$tmp/l3" 128256 "$l3" "$fixtures/tokenizers/llama3-tokenizer_config.json"
"$venv/bin/python" - "$fixtures/tokenizers/sp32k-tokenizer.json" "$tmp/cm-tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
for i, s in enumerate(["<|im_start|>", "<|im_end|>"]):
    t["added_tokens"].append({"id": 32000 + i, "content": s, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
json.dump(t, open(sys.argv[2], "w"))
PY
tiny_model "$tmp/cm" 32002 "$tmp/cm-tokenizer.json" "$fixtures/tokenizers/sp32k-tokenizer_config.json" "$tmp/chatml.jinja"
for m in l2 l3 cm; do
    template=$([ $m = cm ] && echo "--template chatml" || true)
    gen "$tmp/$m" --chat "$tmp/chat.jsonl" $template --max-new-tokens 2 --batch 16 --json | grep reply > "$tmp/$m.chat"
    gen "$tmp/$m" --prompt "Hello, wörld — 数字 ✓" --prompt "  two  spaces" --max-new-tokens 3 --json | grep reply > "$tmp/$m.text"
    "$venv/bin/python" - "$tmp/$m" "$tmp/chat.jsonl" "$tmp/$m.chat" "$tmp/$m.text" <<'PY' || fail "$m: prompts differ from transformers'"
import json, sys
from tokenizers import Tokenizer
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1]) # renders; tokenizers encodes, as chat_data_ref.py
raw = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
convs = [json.loads(l)["messages"] for l in open(sys.argv[2])]
replies = [json.loads(l) for l in open(sys.argv[3])]
assert len(replies) == len(convs), (len(replies), len(convs))
for i, (msgs, r) in enumerate(zip(convs, replies)):
    if msgs[-1]["role"] == "assistant": msgs = msgs[:-1]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    want = raw.encode(text, add_special_tokens=False).ids
    assert r["prompt_ids"] == want, f"conversation {i}: {r['prompt_ids']} != {want}"
    assert r["text"] == raw.decode([t for t in r["ids"] if not (r["stop"] == "stop" and t == r["ids"][-1])], skip_special_tokens=False), r
texts = ["Hello, wörld — 数字 ✓", "  two  spaces"]
for t, r in zip(texts, [json.loads(l) for l in open(sys.argv[4])]):
    assert r["prompt_ids"] == raw.encode(t).ids, (t, r["prompt_ids"])
print(f"{sys.argv[1]}: {len(convs)} chat prompts and {len(texts)} text prompts as apply_chat_template and tokenizers give them")
PY
done
expect_error 1 "--stop 'not-one-token': unknown stop string: not one token of $tmp/l2's tokenizer" \
    gen "$tmp/l2" --prompt hi --stop not-one-token
gen "$tmp/l2" --prompt hi --stop "</s>" --stop "<unk>" --max-new-tokens 2 > /dev/null 2>&1 || fail "--stop with token strings"
echo "fsdpctl generate: greedy as transformers', batching, --json, stops, seeds, adapters, templates, errors"
