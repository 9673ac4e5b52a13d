#!/usr/bin/env bash
# data.packing (F26) end to end on the CPU: fsdpctl tokenize prints what packing makes of a
# chat dataset (rows, efficiency), and fsdpd trains packed rows of it (positions restarting
# at each conversation, attention inside it: the kernels' and model's tests check the math)
# with the loss falling; the same job unpacked takes more steps' worth of rows.
source "$(dirname "$0")/lib.sh"
python3 scripts/gen_chat_data.py --out "$tmp/chat.jsonl" --n 600 > /dev/null || fail "cannot generate the chat data"
out=$("$fsdpctl" tokenize --tokenizer configs/models/tiny-sp32k --data "$tmp/chat.jsonl" --format chat \
      --template llama2 --seq-len 256 --out "$tmp/chat.tokens") || fail "tokenize failed"
echo "$out" | tail -1
eff=$(sed -n 's/^packing (data.packing=true): \([0-9]*\) rows of 256, efficiency \([0-9.]*\)%.*one sample a row: \([0-9.]*\)%$/\1 \2 \3/p' <<<"$out")
read -r rows packed padded <<<"$eff"
[ -n "$rows" ] || fail "no packing line"
awk -v p="$packed" -v q="$padded" 'BEGIN { exit !(p > 80 && q < 30 && p <= 100) }' || fail "packing efficiency $packed% (padded $padded%)"
run() { # NAME ARGS...
    local name=$1
    shift
    "$fsdpd" --job configs/jobs/tiny-chat.json --data.path="$tmp/chat.tokens" --data.format=tokens --data.template= --data.seq_len=256 \
        --checkpoint.dir="$tmp/$name.ckpt" --output.dir="$tmp/$name.out" --checkpoint.resume=never \
        --checkpoint.save_final=false --output.consolidate=false --train.max_steps=16 --train.micro_batch=2 \
        --runtime.metrics="$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log"; fail "$name failed"; }
}
run packed --data.packing=true
first=$(sed -n '1s/.*"loss":\([0-9.e+-]*\).*/\1/p' "$tmp/packed.jsonl")
last=$(sed -n '$s/.*"loss":\([0-9.e+-]*\).*/\1/p' "$tmp/packed.jsonl")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2.5) }' || fail "packed: the loss went from $first to $last"
tokens_packed=$(sed -n '1s/.*"tokens":\([0-9]*\).*/\1/p' "$tmp/packed.jsonl")
run padded --data.packing=false --train.max_steps=2 --train.warmup_steps=1
tokens_padded=$(sed -n '1s/.*"tokens":\([0-9]*\).*/\1/p' "$tmp/padded.jsonl")
[ "$tokens_packed" -gt $((3 * tokens_padded)) ] || fail "a packed step trained $tokens_packed label tokens, padded $tokens_padded"
echo "packing: $rows rows at $packed% (padded $padded%); loss $first -> $last in 16 packed steps; label tokens a step: $tokens_packed packed, $tokens_padded padded"
