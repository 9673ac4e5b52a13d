#!/usr/bin/env bash
# fsdpctl reference against transformers' golden outputs: logits, loss, every gradient and
# one AdamW step of the tiny golden Llama, Qwen2 (q/k/v biases), Qwen3 (q_norm/k_norm, head_dim
# 24, tied) and Mistral (sliding window 12 over 33 tokens) must match expected.safetensors to
# 1e-4 relative per tensor (checked with fsdpctl compare); then compare's and reference's
# refusals.
source "$(dirname "$0")/lib.sh"
golden=$fixtures/golden/tiny-mha

# --- the golden comparison --------------------------------------------------------------
"$fsdpctl" reference "$golden" "$golden/batch.safetensors" --out "$tmp/out.safetensors" \
    --adamw 1e-3,0.9,0.95,1e-8,0.1
"$fsdpctl" compare "$tmp/out.safetensors" "$golden/expected.safetensors" --rtol 1e-4 \
    > "$tmp/compare.txt" || { cat "$tmp/compare.txt" >&2; fail "reference does not match the golden outputs"; }
cat "$tmp/compare.txt"
# 2 layers x 9 + embedding + norm + lm_head = 21 parameters: logits, loss, 21 grads, 21 steps.
grep -q '^44 tensors compared, .*: 0 problems$' "$tmp/compare.txt" || fail "not every tensor was compared"

# --- the other families -------------------------------------------------------------------
# tensors: logits, loss, and a gradient and a step for each parameter
for family in tiny-qwen2:27 tiny-qwen3:24 tiny-mistral-sw:21; do
    dir=$fixtures/golden/${family%:*} params=${family#*:}
    "$fsdpctl" reference "$dir" "$dir/batch.safetensors" --out "$tmp/$family.safetensors" \
        --adamw 1e-3,0.9,0.95,1e-8,0.1 > /dev/null
    "$fsdpctl" compare "$tmp/$family.safetensors" "$dir/expected.safetensors" --rtol 1e-4 \
        > "$tmp/compare.txt" || { cat "$tmp/compare.txt" >&2; fail "${family%:*}: reference does not match the golden outputs"; }
    echo "${family%:*}: $(tail -1 "$tmp/compare.txt")"
    grep -q "^$((2 + 2 * params)) tensors compared, .*: 0 problems$" "$tmp/compare.txt" ||
        fail "${family%:*}: not every tensor was compared"
done
grep -q '^grad.model.layers.1.self_attn.v_proj.bias ' <("$fsdpctl" compare "$tmp/tiny-qwen2:27.safetensors" \
    "$fixtures/golden/tiny-qwen2/expected.safetensors") || fail "qwen2: the biases' gradients were not compared"
grep -q '^adamw.model.layers.0.self_attn.k_norm.weight ' <("$fsdpctl" compare "$tmp/tiny-qwen3:24.safetensors" \
    "$fixtures/golden/tiny-qwen3/expected.safetensors") || fail "qwen3: the q/k norms were not compared"
# The window matters: the same Mistral without it is off the golden.
mkdir -p "$tmp/nowindow" && cp "$fixtures/golden/tiny-mistral-sw/model.safetensors" "$tmp/nowindow/"
sed 's/"sliding_window": 12/"sliding_window": null/' "$fixtures/golden/tiny-mistral-sw/config.json" > "$tmp/nowindow/config.json"
grep -q '"sliding_window": null' "$tmp/nowindow/config.json" || fail "no window removed"
"$fsdpctl" reference "$tmp/nowindow" "$fixtures/golden/tiny-mistral-sw/batch.safetensors" --out "$tmp/nowindow.safetensors" > /dev/null
expect_status 1 "> rtol" "$fsdpctl" compare "$tmp/nowindow.safetensors" "$fixtures/golden/tiny-mistral-sw/expected.safetensors" \
    --rtol 1e-4 --subset

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
