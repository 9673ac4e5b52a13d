#!/usr/bin/env bash
# fsdpctl tokenize --tokenizer: --text (plain and --json, with and without special tokens,
# --split-special), --decode, --jsonl, a model directory with tokenizer_config.json, and the
# refusals (a stray argument, --out without --data, bad ids, bad files, unsupported parts).
source "$(dirname "$0")/lib.sh"

sp=$fixtures/tokenizers/sp32k-tokenizer.json
l3=$(fixture tokenizers/llama3-tokenizer.json)
want() { # WANT CMD...: CMD prints exactly WANT
    local got
    got=$("${@:2}") || fail "'${*:2}' failed"
    [ "$got" = "$1" ] || fail "'${*:2}' printed '$got', expected '$1'"
}
want "1 22557 28725 586 3914 349 17949" "$fsdpctl" tokenize --tokenizer "$sp" --text "Hello, my dog is cute"
want "22557 28725 586 3914 349 17949" "$fsdpctl" tokenize --tokenizer "$sp" --text "Hello, my dog is cute" --no-add-special
want '{"ids":[1,1]}' "$fsdpctl" tokenize --tokenizer "$sp" --text "<s>" --json
want "1 523 28713 28767" "$fsdpctl" tokenize --tokenizer "$sp" --text "<s>" --split-special
want "128000 6151 128009" "$fsdpctl" tokenize --tokenizer "$l3" --text "<|begin_of_text|>hi<|eot_id|>"
want "<s> Hello," "$fsdpctl" tokenize --tokenizer "$sp" --decode "1 22557 28725"
want '{"text":"<|begin_of_text|>hi"}' "$fsdpctl" tokenize --tokenizer "$l3" --decode "128000 6151" --json
printf '%s\n' '{"text": "a"}' '{"ids": [9906, 11]}' '{"text": ""}' > "$tmp/in.jsonl"
want $'64\n{"text":"Hello,"}' "$fsdpctl" tokenize --tokenizer "$l3" --jsonl "$tmp/in.jsonl"

# A model directory: tokenizer_config.json's add_eos_token wins over the post-processor, logged.
mkdir "$tmp/model"
cp "$sp" "$tmp/model/tokenizer.json"
echo '{"add_bos_token": true, "add_eos_token": true, "bos_token": "<s>", "eos_token": "</s>"}' \
    > "$tmp/model/tokenizer_config.json"
want "1 264 2" "$fsdpctl" tokenize --tokenizer "$tmp/model" --text "a"
expect_error 0 "following tokenizer_config.json" "$fsdpctl" tokenize --tokenizer "$tmp/model" --text a

# Refusals.
expect_error 2 "usage" "$fsdpctl" tokenize --tokenizer "$sp" --out "$tmp/c.tokens" data.jsonl
expect_error 2 "usage" "$fsdpctl" tokenize --tokenizer "$sp" --out "$tmp/c.tokens" --text a
expect_error 2 "usage" "$fsdpctl" tokenize --tokenizer "$sp" --data data.jsonl --format chat --out "$tmp/c.tokens"
expect_error 1 "--format: 'yaml' is not alpaca, chat, text or preference" "$fsdpctl" tokenize --tokenizer "$sp" \
    --data data.jsonl --format yaml --seq-len 8 --out "$tmp/c.tokens"
expect_error 2 "usage" "$fsdpctl" tokenize --tokenizer "$sp" --text a --decode 1
expect_error 1 "id 99999 is not in the vocabulary" "$fsdpctl" tokenize --tokenizer "$sp" --decode "1 99999"
expect_error 1 "not a list of ids" "$fsdpctl" tokenize --tokenizer "$sp" --decode "1 x"
printf '{"text": "a\\u00"}\n' > "$tmp/bad.jsonl"
expect_error 1 "bad.jsonl:1" "$fsdpctl" tokenize --tokenizer "$sp" --jsonl "$tmp/bad.jsonl"
echo '{"model": {"type": "WordPiece", "vocab": {}}}' > "$tmp/wp.json"
expect_error 1 'model type "WordPiece" is not supported' "$fsdpctl" tokenize --tokenizer "$tmp/wp.json" --text a
expect_error 1 "nope.json" "$fsdpctl" tokenize --tokenizer "$tmp/nope.json" --text a
echo "ok"
