#!/usr/bin/env bash
# data.format preference (F49): JSONL preference records against TRL 1.16.0's own pipeline
# (tests/integration/pref_data_ref.py: DPOTrainer._prepare_dataset and the collator's
# truncation, taken from TRL's wheel and run without torch) on the llama3 and sp32k tokenizers
# (llama3 and llama2 templates), string and conversational records, explicit and implicit
# prompts, max_length 4096 and a short one, keep_start and keep_end; --show of both sides of a
# pair; the bad-record paths (line and reason); and fsdpd: a DPO job on a JSONL file on the CPU
# whose losses and reward metrics equal those of the same pairs given as a cache of pairs
# (fsdpctl tokenize --from-safetensors --pairs).
source "$(dirname "$0")/lib.sh"

# datasets pins its own numpy and pyarrow: a venv of its own; TRL from its wheel (no torch)
FSDP_VENV=${FSDP_VENV:-/tmp/fsdp-venv}-trl use_venv "transformers==5.17.0" jinja2 tokenizers datasets safetensors
pypi_file dpo_py trl==1.16.0 trl/trainer/dpo_trainer.py
export PYTHONPATH=${dpo_py%/trl/trainer/dpo_trainer.py}
ref() { "$venv/bin/python" tests/integration/pref_data_ref.py "$@"; }
ref gen "$tmp"

# Model directories: llama3 with fsdpd's llama3 template (data/chat_template.c's Jinja: the
# generation header only with add_generation_prompt; the fixture's tokenizer_config.json has
# the first Llama 3 release's, which always appends it, and TRL's completions would carry it);
# sp32k with Llama 2's template, read as tokenizer.json says (PreTrainedTokenizerFast:
# transformers 5's LlamaTokenizer class rebuilds the pre-tokenizer, and drops a leading
# space's "▁" that tokenizers keeps).
mkdir -p "$tmp/l3" "$tmp/sp"
ln -s "$(realpath "$(fixture tokenizers/llama3-tokenizer.json)")" "$tmp/l3/tokenizer.json"
ln -s "$(realpath "$fixtures/tokenizers/sp32k-tokenizer.json")" "$tmp/sp/tokenizer.json"
"$venv/bin/python" - "$fixtures/tokenizers" "$tmp" <<'PY'
import json, sys
src, out = sys.argv[1], sys.argv[2]
l3 = json.load(open(f"{src}/llama3-tokenizer_config.json"))
l3["chat_template"] = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                       "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if "
                       "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
json.dump(l3, open(f"{out}/l3/tokenizer_config.json", "w"))
sp = json.load(open(f"{src}/sp32k-tokenizer_config.json"))
sp.update(chat_template=open(f"{src}/llama2-chat_template.jinja").read(), tokenizer_class="PreTrainedTokenizerFast")
json.dump(sp, open(f"{out}/sp/tokenizer_config.json", "w"))
PY

tok() { "$fsdpctl" tokenize --format preference "$@"; }
cases=()
for tk in l3 sp; do
    for data in text conv implicit_text implicit_conv; do
        for mode in keep_start:4096 keep_start:32 keep_end:24; do
            m=${mode%:*} L=${mode#*:} dump=$tmp/$tk-$data-$m-$L.dump
            tok --tokenizer "$tmp/$tk" --data "$tmp/$data.jsonl" --seq-len "$L" --truncation-mode "$m" \
                --dump-jsonl "$dump" > "$tmp/tok.log" 2>&1 || { cat "$tmp/tok.log"; fail "$tk $data $m $L: fsdpctl failed"; }
            grep -q "template $([ "${data%conv}" = "$data" ] && echo none || { [ $tk = l3 ] && echo llama3 || echo llama2; })" "$tmp/tok.log" ||
                { cat "$tmp/tok.log"; fail "$tk $data: not the template auto should find"; }
            cases+=("$tmp/$tk" "$tmp/$data.jsonl" "$L" "$m" "$dump")
        done
    done
done
ref check "$dpo_py" "${cases[@]}" 2> "$tmp/ref.err" | sed "s|$tmp/||" || { cat "$tmp/ref.err"; fail "fsdpd's pairs differ from TRL's"; }

# --show K: K pairs, each side with the prompt before « and its completion between « and »
tok --tokenizer "$tmp/l3" --data "$tmp/conv.jsonl" --seq-len 4096 --show 2 > "$tmp/show"
[ "$(grep -c '^pair [12], \(chosen\|rejected\): [0-9]* tokens, the prompt.s [0-9]*, [0-9]* with loss' "$tmp/show")" = 4 ] ||
    { cat "$tmp/show"; fail "--show 2: not both sides of two pairs"; }
{ grep -q '^<|begin_of_text|><|start_header_id|>user<|end_header_id|>$' "$tmp/show" && grep -q '^«.*<|eot_id|>»$' "$tmp/show"; } ||
    { cat "$tmp/show"; fail "--show: no prompt then «completion»"; }
grep -q 'pair 3' "$tmp/show" && fail "--show 2 showed a third pair"
tok --tokenizer "$tmp/l3" --data "$tmp/text.jsonl" --seq-len 4096 --truncation-mode keep_end --format text --show 1 > "$tmp/bad.log" 2>&1 &&
    fail "--truncation-mode with --format text accepted"

# --- bad records: the line and the reason; skip counts them ----------------------------------
good='{"prompt": "Q", "chosen": " a", "rejected": " b"}'
bad() { # NEEDLE LINE: LINE as the second record is a bad record naming NEEDLE
    printf '%s\n%s\n' "$good" "$2" > "$tmp/bad.jsonl"
    expect_error 1 "bad.jsonl:2: $1" tok --tokenizer "$tmp/l3" --data "$tmp/bad.jsonl" --seq-len 64 --out "$tmp/bad.tokens"
    tok --tokenizer "$tmp/l3" --data "$tmp/bad.jsonl" --seq-len 64 --on-bad-record skip --out "$tmp/bad.tokens" > "$tmp/skip.log" 2>&1 ||
        { cat "$tmp/skip.log"; fail "skip: failed on $2"; }
    grep -q "1 pairs .* from 2 records; 1 skipped" "$tmp/skip.log" || { cat "$tmp/skip.log"; fail "skip: not counted: $2"; }
}
bad 'no "rejected" field' '{"prompt": "Q", "chosen": " a"}'
bad '"chosen" is neither a string nor a list of messages' '{"prompt": "Q", "chosen": 3, "rejected": " b"}'
bad 'prompt is a list but chosen is a string' '{"prompt": [{"role": "user", "content": "Q"}], "chosen": " a", "rejected": " b"}'
bad 'a conversational record among string ones' '{"prompt": [{"role": "user", "content": "Q"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}'
bad 'no "prompt", and chosen and rejected differ from their first character: no implicit prompt' '{"chosen": "yes", "rejected": "no"}'
bad 'no "prompt", and chosen and rejected do not differ (one is the other' '{"chosen": "Q yes", "rejected": "Q yes!"}'
printf '%s\n' "$good" '{"prompt": "Q", "chosen": "'"$(printf ' x%.0s' $(seq 80))"'", "rejected": " b"}' > "$tmp/long.jsonl"
expect_error 1 "long.jsonl:2: prompt + chosen: 82 tokens, more than data.seq_len 64" \
    tok --tokenizer "$tmp/l3" --data "$tmp/long.jsonl" --seq-len 64 --no-truncate --out "$tmp/bad.tokens"
conv() { printf '{"prompt": [%s], "chosen": [%s], "rejected": [{"role": "assistant", "content": "b"}]}' "$1" "$2"; }
u='{"role": "user", "content": "Q"}' a='{"role": "assistant", "content": "a"}'
printf '%s\n%s\n' "$(conv "$u" "$a")" "$(conv "$u, $a" "$a")" > "$tmp/bad.jsonl"
expect_error 1 "bad.jsonl:2: the prompt does not end with a user turn" tok --tokenizer "$tmp/l3" --data "$tmp/bad.jsonl" --seq-len 64 --out "$tmp/bad.tokens"
printf '%s\n%s\n' "$(conv "$u" "$a")" "$(conv "$u" "$u")" > "$tmp/bad.jsonl"
expect_error 1 "bad.jsonl:2: chosen does not start with an assistant turn" tok --tokenizer "$tmp/l3" --data "$tmp/bad.jsonl" --seq-len 64 --out "$tmp/bad.tokens"
# conversational records and no template: fatal before any record (sp32k alone has none)
mkdir -p "$tmp/bare" && ln -s "$(realpath "$fixtures/tokenizers/sp32k-tokenizer.json")" "$tmp/bare/tokenizer.json"
expect_error 1 "conversational preference records need a chat template" tok --tokenizer "$tmp/bare" --data "$tmp/conv.jsonl" --seq-len 64 --out "$tmp/bad.tokens"
tok --tokenizer "$tmp/bare" --data "$tmp/text.jsonl" --seq-len 64 --out "$tmp/bad.tokens" > /dev/null || fail "string records need no template"

# --- fsdpd: DPO on the JSONL file == DPO on the same pairs as a cache of pairs -----------------
# A tiny random model of sp32k's vocabulary; the pairs of conv.jsonl (llama2 template) at
# seq_len 64, keep_start (a --pairs row starts with its prompt); the JSONL route tokenizes in
# checkpoint.dir, the other is fsdpctl's --dump-jsonl of the same file, as a batch file.
sed 's/"num_hidden_layers": 4/"num_hidden_layers": 1/; s/"hidden_size": 256/"hidden_size": 64/; s/"intermediate_size": 688/"intermediate_size": 128/; s/"head_dim": 32/"head_dim": 16/' \
    configs/models/tiny.json > "$tmp/cfg.json"
"$fsdpctl" init --model-config "$tmp/cfg.json" --out "$tmp/model" > /dev/null
cp "$tmp/sp/tokenizer.json" "$tmp/sp/tokenizer_config.json" "$tmp/model/"
tok --tokenizer "$tmp/model" --data "$tmp/conv.jsonl" --seq-len 64 --dump-jsonl "$tmp/conv.dump" > /dev/null
"$venv/bin/python" - "$tmp/conv.dump" "$tmp/pairs.safetensors" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import save_file
rows = [json.loads(l) for l in open(sys.argv[1])]
ids = np.zeros((len(rows), 64), np.int32)
labels = np.full((len(rows), 64), -100, np.int32)
for i, r in enumerate(rows):
    ids[i, :len(r["input_ids"])], labels[i, :len(r["labels"])] = r["input_ids"], r["labels"]
save_file({"input_ids": ids, "labels": labels}, sys.argv[2])
PY
"$fsdpctl" tokenize --from-safetensors "$tmp/pairs.safetensors" --pairs --vocab 32000 --out "$tmp/pairs.tokens" > /dev/null
cat > "$tmp/job.json" <<JSON
{
  "model": {"path": "$tmp/model", "dtype": "f32"},
  "data": {"path": "$tmp/conv.jsonl", "format": "preference", "seq_len": 64, "shuffle": false},
  "train": {"type": "lora", "global_batch": 4, "max_steps": 3, "lr": 1e-2, "schedule": "constant",
            "clip_norm": 0, "objective": "dpo"},
  "lora": {"rank": 4, "alpha": 8, "dropout": 0, "targets": ["q_proj", "v_proj"]},
  "checkpoint": {"resume": "never", "save_final": false},
  "output": {"consolidate": false},
  "runtime": {"backend": "cpu", "heartbeat_s": 1, "comm_timeout_s": 60}
}
JSON
run() { # NAME OVERRIDES...
    local name=$1
    shift
    "$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=1 --checkpoint.dir="$tmp/$name.ckpt" \
        --output.dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "fsdpd ($name) failed"; }
}
run jsonl
grep -q "tokenizing $tmp/conv.jsonl (format preference, template llama2)" "$tmp/jsonl.log" || { cat "$tmp/jsonl.log"; fail "no cache built from the JSONL"; }
run cache --data.path="$tmp/pairs.tokens" --data.format=tokens
run auto --data.format=auto --train.max_steps=1
grep -q "data.format auto: preference (its first record has chosen and rejected)" "$tmp/auto.log" ||
    { cat "$tmp/auto.log"; fail "data.format auto: not preference"; }
"$venv/bin/python" - "$tmp/jsonl/metrics.jsonl" "$tmp/cache/metrics.jsonl" <<'PY' || fail "DPO on the JSONL differs from DPO on the cache of pairs"
import json, sys
a, b = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
names = ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected"]
bad = len(a) != 3 or len(b) != 3
for x, y in zip(a, b):
    for n in names:
        if x.get(n) is None or x.get(n) != y.get(n):
            bad = True
            print(f"step {x['step']}: {n} {x.get(n)!r} from the JSONL, {y.get(n)!r} from the cache")
    print(f"step {x['step']}: loss {x['loss']:.9f} (JSONL) {y['loss']:.9f} (cache)")
moved = a[0]["loss"] != a[-1]["loss"]
print("the loss moved" if moved else "the loss did not move")
sys.exit(1 if bad or not moved else 0)
PY
expect_error 2 "data.format: preference records are pairs, for train.objective dpo or orpo (not sft)" \
    "$fsdpd" --job "$tmp/job.json" --train.objective=sft --checkpoint.dir="$tmp/sft.ckpt" --output.dir="$tmp/sft"
echo "preference JSONL: fsdpd's pairs are TRL 1.16.0's; DPO on them equals DPO on the cache of pairs"
