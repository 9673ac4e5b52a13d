#!/usr/bin/env bash
# A complete output (F41): for every chat template fsdpd has (llama3, llama2, chatml, alpaca),
# `fsdpctl init --tokenizer --template` writes the Jinja that fsdpd's outputs carry into
# chat_template.jinja and tokenizer_config.json (the same string), and transformers'
# apply_chat_template with it, tokenized by tokenizers, gives exactly the ids fsdpd trains on
# (fsdpctl tokenize --dump-jsonl) on the shared chat data, and with add_generation_prompt the
# prompt fsdpctl generate --chat renders (the template recognised from tokenizer_config.json);
# generation_config.json gets the template's end of turn.  Then fsdpd jobs on the CPU, a full
# fine-tune of a random init and a LoRA of a pretrained base: each output has the tokenizer, the
# template, the stop ids, loss.svg and a README.md model card (base, data file, records, tokens,
# template, every resolved setting, final and best eval loss), and fsdpctl generate --chat runs
# on it.
source "$(dirname "$0")/lib.sh"
use_venv "transformers==5.17.0" jinja2 tokenizers
py() { "$venv/bin/python" "$@"; }
"$venv/bin/python" tests/integration/chat_data_ref.py gen "$tmp"
cat "$fixtures/data/chat.jsonl" >> "$tmp/chat.jsonl"
py - "$tmp/chat.jsonl" "$tmp/single.jsonl" <<'PY' # alpaca takes one user turn and its reply
import json, sys
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        m = json.loads(line)["messages"]
        if [x["role"] for x in m] == ["user", "assistant"]: out.write(line)
PY

# Tokenizer directories: llama3's, sp32k's, sp32k with ChatML's two tokens.
mkdir -p "$tmp/tk-sp" "$tmp/tk-l3" "$tmp/tk-cm"
cp "$fixtures/tokenizers/sp32k-tokenizer.json" "$tmp/tk-sp/tokenizer.json"
cp "$fixtures/tokenizers/sp32k-tokenizer_config.json" "$tmp/tk-sp/tokenizer_config.json"
l3=$(fixture tokenizers/llama3-tokenizer.json)
cp "$l3" "$tmp/tk-l3/tokenizer.json"
py - "$fixtures/tokenizers/llama3-tokenizer_config.json" "$tmp/tk-l3/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.pop("chat_template", None) # init --template writes its own
json.dump(c, open(sys.argv[2], "w"))
PY
cp "$tmp/tk-sp/tokenizer_config.json" "$tmp/tk-cm/"
py - "$fixtures/tokenizers/sp32k-tokenizer.json" "$tmp/tk-cm/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
for i, s in enumerate(["<|im_start|>", "<|im_end|>"]):
    t["added_tokens"].append({"id": 32000 + i, "content": s, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
json.dump(t, open(sys.argv[2], "w"))
PY
cfg() { # VOCAB: a one-layer model of that vocabulary
    sed "s/\"vocab_size\": 32000/\"vocab_size\": $1/; s/\"num_hidden_layers\": 4/\"num_hidden_layers\": 1/; s/\"hidden_size\": 256/\"hidden_size\": 64/; s/\"intermediate_size\": 688/\"intermediate_size\": 128/; s/\"head_dim\": 32/\"head_dim\": 16/; s/\"max_position_embeddings\": 512/\"max_position_embeddings\": 4096/" \
        configs/models/tiny.json > "$tmp/cfg$1.json"
    echo "$tmp/cfg$1.json"
}

# --- every template: the Jinja against the ids fsdpd trains on -----------------------------
check_template() { # TEMPLATE TOKENIZER_DIR VOCAB DATA END_TOKEN
    local m=$tmp/m-$1
    "$fsdpctl" init --model-config "$(cfg "$3")" --out "$m" --tokenizer "$2" --template "$1" > /dev/null
    "$fsdpctl" tokenize --tokenizer "$m" --data "$4" --format chat --template "$1" --seq-len 4096 \
        --dump-jsonl "$tmp/$1.dump" > /dev/null
    "$fsdpctl" generate "$m" --chat "$4" --max-new-tokens 1 --batch 32 --json 2> /dev/null | grep reply > "$tmp/$1.gen"
    py - "$m" "$4" "$tmp/$1.dump" "$tmp/$1.gen" "$5" <<'PY' || fail "$1: the written template does not give fsdpd's ids"
import json, sys
from tokenizers import Tokenizer
from transformers import AutoTokenizer
m, data, dump, gen, end = sys.argv[1:]
jinja = open(m + "/chat_template.jinja").read()
assert json.load(open(m + "/tokenizer_config.json"))["chat_template"] == jinja, "tokenizer_config.json's chat_template differs"
tok = AutoTokenizer.from_pretrained(m)  # reads chat_template.jinja
raw = Tokenizer.from_file(m + "/tokenizer.json")
convs = [json.loads(l)["messages"] for l in open(data)]
trained = [json.loads(l)["input_ids"] for l in open(dump)]
prompts = [json.loads(l)["prompt_ids"] for l in open(gen)]
assert len(convs) == len(trained) == len(prompts), (len(convs), len(trained), len(prompts))
for i, msgs in enumerate(convs):
    ids = raw.encode(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False).ids
    assert ids == trained[i], f"conversation {i}: apply_chat_template gives\n{ids}\nfsdpd trains on\n{trained[i]}"
    head = raw.encode(tok.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True), add_special_tokens=False).ids
    assert head == prompts[i], f"conversation {i}: the generation prompt\n{head}\nfsdpctl generate --chat\n{prompts[i]}"
eos = json.load(open(m + "/generation_config.json"))["eos_token_id"]
assert raw.token_to_id(end) in eos, (end, eos)
print(f"{m}: {len(convs)} conversations: apply_chat_template = fsdpd's ids, generation prompts too; stop ids {eos}")
PY
}
check_template llama2 "$tmp/tk-sp" 32000 "$tmp/chat.jsonl" "</s>"
check_template llama3 "$tmp/tk-l3" 128256 "$tmp/chat.jsonl" "<|eot_id|>"
check_template chatml "$tmp/tk-cm" 32002 "$tmp/chat.jsonl" "<|im_end|>"
check_template alpaca "$tmp/tk-sp" 32000 "$tmp/single.jsonl" "</s>"
expect_error 1 "--tokenizer $tmp/tk-l3: its ids reach 128255, past the model's vocab_size 32000" \
    "$fsdpctl" init --model-config "$(cfg 32000)" --out "$tmp/bad" --tokenizer "$tmp/tk-l3"
expect_error 1 "the tokenizer has no <|im_start|> token" \
    "$fsdpctl" init --model-config "$(cfg 32000)" --out "$tmp/bad2" --tokenizer "$tmp/tk-sp" --template chatml
expect_error 2 "--template needs --tokenizer" "$fsdpctl" init --model-config "$(cfg 32000)" --out "$tmp/bad3" --template llama2

# --- fsdpd's outputs ----------------------------------------------------------------------------
# A random init whose tokenizer sits beside its config (the output gets it), llama2 chat data.
mkdir -p "$tmp/rand"
cp "$(cfg 32000)" "$tmp/rand/config.json"
cp "$tmp/tk-sp/tokenizer.json" "$tmp/tk-sp/tokenizer_config.json" "$tmp/rand/"
job() { # NAME ARGS...: a short CPU job on the chat data with eval
    local name=$1
    shift
    timeout 300 "$fsdpd" --job configs/jobs/tiny-chat.json --data.path="$tmp/chat.jsonl" --data.format=chat \
        --data.template=llama2 --data.seq_len=256 --data.eval_fraction=0.1 --train.eval_interval=2 \
        --train.max_steps=4 --train.warmup_steps=1 --train.global_batch=4 --train.micro_batch=2 --runtime.backend=cpu \
        --runtime.workers_per_node=1 --checkpoint.dir="$tmp/$name.ckpt" --checkpoint.resume=never \
        --output.dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log"; fail "$name: fsdpd failed"; }
}
job full --model.init=random --model.config="$tmp/rand/config.json"
# A pretrained base: the full job's output, with a LoRA (the adapter directory and merged/).
job lora --model.path="$tmp/full" --model.init= --model.config= --train.type=lora --lora.rank=4 --lora.alpha=8 --output.merge=true
check_output() { # DIR LIBRARY
    local d=$1
    for f in README.md loss.svg chat_template.jinja tokenizer.json tokenizer_config.json; do
        [ -f "$d/$f" ] || fail "$d has no $f"
    done
    grep -q "<svg" "$d/loss.svg" || fail "$d/loss.svg is not an SVG"
    py - "$d" "$2" "$tmp/chat.jsonl" "$tmp/llama2.dump" <<'PY' || fail "$d: its model card or template"
import json, re, sys
d, library, data, dump = sys.argv[1:]
card = open(d + "/README.md").read()
job = json.load(open(d + ("/../job.json" if d.endswith("/merged") else "/job.json")))
run = json.load(open(d + ("/../run.json" if d.endswith("/merged") else "/run.json")))
s = run["summary"]
assert card.startswith("---\n") and f"library_name: {library}\n" in card, card[:200]
records = sum(1 for _ in open(data))  # every conversation fits seq_len 256
for want in ["file: `chat.jsonl`", "format: chat, chat template llama2", f"records: {records}",
             "![loss curve](loss.svg)", f"final training loss: {s['final_loss']:.4f}",
             f"final eval loss: {s['final_eval_loss']:.4f}; best eval loss: {s['best_eval_loss']:.4f} (step {s['best_eval_step']})"]:
    assert want in card, f"the card lacks {want!r}"
assert re.search(r"tokens: [1-9][0-9]* \(sequence length 256\)", card), "no token count"
rows = dict(re.findall(r"^\| `([a-z_]+\.[a-z_0-9]+)` \| `(.*)` \|$", card, re.M))
def same(a, b):
    if isinstance(a, float) or isinstance(b, float): return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1e-300)
    if isinstance(a, list): return len(a) == len(b) and all(map(same, a, b))
    return a == b
for section, keys in job.items():
    for k, v in keys.items():
        got = rows.get(f"{section}.{k}")
        assert got is not None and same(json.loads(got), v), f"the card's {section}.{k}: {got}, job.json {v}"
if job["model"]["init"] != "random": assert f"base_model: {job['model']['path']}\n" in card
jinja = open(d + "/chat_template.jinja").read()
assert json.load(open(d + "/tokenizer_config.json"))["chat_template"] == jinja
from transformers import AutoTokenizer
from tokenizers import Tokenizer
tok, raw = AutoTokenizer.from_pretrained(d), Tokenizer.from_file(d + "/tokenizer.json")
trained = [json.loads(l)["input_ids"] for l in open(dump)]
for i, line in enumerate(open(data)):
    ids = raw.encode(tok.apply_chat_template(json.loads(line)["messages"], tokenize=False), add_special_tokens=False).ids
    assert ids == trained[i], f"conversation {i}"
if library != "peft": assert 2 in json.load(open(d + "/generation_config.json"))["eos_token_id"]  # an adapter has none
print(f"{d}: model card with {sum(len(k) for k in job.values())} settings, template, stops, loss.svg")
PY
}
check_output "$tmp/full" transformers
check_output "$tmp/lora" peft
check_output "$tmp/lora/merged" transformers
[ -f "$tmp/lora/adapter_config.json" ] || fail "the LoRA output is not an adapter directory"
grep -q "^base_model: $tmp/full$" "$tmp/lora/README.md" || fail "the adapter's card names no base"
grep -q "AutoPeftModelForCausalLM" "$tmp/lora/README.md" || fail "the adapter's card does not say how to load it"
"$fsdpctl" generate "$tmp/full" --chat "$fixtures/data/chat.jsonl" --max-new-tokens 4 --json 2> /dev/null | grep -c reply | grep -qx 3 ||
    fail "fsdpctl generate --chat on the output (template auto)"
"$fsdpctl" generate "$tmp/full" --adapter "$tmp/lora" --chat "$fixtures/data/chat.jsonl" --max-new-tokens 4 --json 2> /dev/null |
    grep -c reply | grep -qx 3 || fail "fsdpctl generate --adapter on the LoRA output"
echo "outputs ready to use: templates round-trip for llama3, llama2, chatml, alpaca; model cards; init --tokenizer"
