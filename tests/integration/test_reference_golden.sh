#!/usr/bin/env bash
# fsdpctl reference against transformers' golden outputs: logits, loss, every gradient and
# one AdamW step of the tiny golden Llama must match expected.safetensors to 1e-4 relative
# per tensor (checked with fsdpctl compare); then compare's and reference's refusals.
source "$(dirname "$0")/lib.sh"
golden=$shared/golden/tiny-mha

# --- the golden comparison --------------------------------------------------------------
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --out "$tmp/out.safetensors" \
    --adamw 1e-3,0.9,0.95,1e-8,0.1
"$fsdpctl" compare "$tmp/out.safetensors" "$golden/expected.safetensors" --rtol 1e-4 \
    > "$tmp/compare.txt" || { cat "$tmp/compare.txt" >&2; fail "reference does not match the golden outputs"; }
cat "$tmp/compare.txt"
# 2 layers x 9 + embedding + norm + lm_head = 21 parameters: logits, loss, 21 grads, 21 steps.
grep -q '^44 tensors compared, .*: 0 problems$' "$tmp/compare.txt" || fail "not every tensor was compared"

# --- compare catches differences ----------------------------------------------------------
expect_status 1 "> rtol" "$fsdpctl" compare "$tmp/out.safetensors" "$golden/expected.safetensors" --rtol 1e-12
expect_status 1 "only in" "$fsdpctl" compare "$golden/model.safetensors" "$golden/expected.safetensors"
expect_status 0 "0 problems" "$fsdpctl" compare "$golden/expected.safetensors" "$golden/expected.safetensors" --rtol 0
expect_status 2 "usage" "$fsdpctl" compare "$golden/expected.safetensors"
expect_status 2 "bad --rtol" "$fsdpctl" compare "$tmp/out.safetensors" "$golden/expected.safetensors" --rtol x
expect_status 1 "$tmp/missing.safetensors" "$fsdpctl" compare "$tmp/missing.safetensors" "$golden/expected.safetensors"

# Without --adamw there are no adamw.* tensors.
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --out "$tmp/plain.safetensors" > /dev/null
expect_status 1 "adamw.lm_head.weight" "$fsdpctl" compare "$tmp/plain.safetensors" "$golden/expected.safetensors"
grep -q '^23 tensors compared, .*: 21 problems$' "$tmp/cmd.out" || fail "plain reference: $(tail -1 "$tmp/cmd.out")"

# --- reference's refusals -----------------------------------------------------------------
expect_status 2 "usage" "$fsdpctl" reference "$golden"
expect_status 2 "usage" "$fsdpctl" reference "$golden" "$golden/batch.safetensors"
expect_status 2 "--adamw" "$fsdpctl" reference "$golden" "$golden/batch.safetensors" --out "$tmp/x" --adamw 1e-3,0.9
expect_status 2 "unexpected argument" "$fsdpctl" reference "$golden" "$golden/batch.safetensors" --out "$tmp/x" --bogus
expect_status 1 "input_ids is missing" "$fsdpctl" reference "$golden" "$golden/model.safetensors" --out "$tmp/x"
expect_status 1 "$tmp/nope" "$fsdpctl" reference "$golden" "$tmp/nope" --out "$tmp/x"
expect_status 1 "$tmp" "$fsdpctl" reference "$tmp" "$golden/batch.safetensors" --out "$tmp/x"
[ ! -e "$tmp/x" ] || fail "a failed reference left $tmp/x behind"
echo "reference golden: ok"
