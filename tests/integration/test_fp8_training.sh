#!/usr/bin/env bash
# train.precision fp8 (F45) end to end on the CPU backend (FP8's rounding emulated exactly,
# base/fp8.h), 2 workers, a 4-layer model at a Llama-like init: the log says which layers
# run in FP8; 30 steps with tensorwise and with rowwise scales end within 1% of the bf16 run's
# loss (the compute dtype: fp32 on the CPU) without being its bits; the FP8 layers gathered as
# codes (train.fp8_all_gather, the default) give the bits of gathering them in the compute dtype
# and casting at each GEMM, over half the bytes; a resumed FP8 run gives the
# uninterrupted one's bits (no scaling state outside the checkpoint); e5m2 gradients
# (train.fp8_grad_format) logged, and another run; `fsdpctl plan` says its step
# time is at bf16's GEMM rates; refused: adapters, a
# preference objective, a model without a middle layer, FP8 gathers with rowwise scales.
source "$(dirname "$0")/lib.sh"
cat > "$tmp/model.json" <<JSON
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 61,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
 "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02}
JSON
make_small_data "$tmp/data.tokens" 96 32
common=(--model.init=random --model.config="$tmp/model.json" --data.path="$tmp/data.tokens" --data.format=tokens
        --data.seq_len=32 --train.global_batch=8 --train.micro_batch=4 --train.max_steps=30 --train.lr=3e-3
        --runtime.backend=cpu --runtime.workers_per_node=2 --runtime.heartbeat_s=1 --checkpoint.resume=never
        --output.consolidate=false --checkpoint.save_final=false)
run() { # NAME overrides...
    local name=$1
    shift
    "$fsdpd" "${common[@]}" --checkpoint.dir="$tmp/ck-$name" --output.dir="$tmp/out-$name" \
        --runtime.metrics="$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 || { tail -5 "$tmp/$name.log"; fail "$name failed"; }
}
last_loss() { tail -1 "$tmp/$1.jsonl" | sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p'; }
run bf16
run tensorwise --train.precision=fp8
run gathered_bf16 --train.precision=fp8 --train.fp8_all_gather=false
run rowwise --train.precision=fp8 --train.fp8_scaling=rowwise --train.fp8_all_gather=false
run e5m2 --train.precision=fp8 --train.fp8_grad_format=e5m2
grep -q "(e4m3, gradients e5m2, tensorwise scales" "$tmp/e5m2.log" || fail "e5m2 gradients are not logged"
[ "$(last_loss e5m2)" != "$(last_loss tensorwise)" ] || fail "e5m2 gradients trained e4m3's bits"
grep -q "train.precision fp8: the projections of layers 1-2 of 4 in FP8 (e4m3, gradients e4m3, tensorwise scales" "$tmp/tensorwise.log" ||
    fail "the FP8 layers are not logged"
grep -q "their weights gathered as e4m3 codes" "$tmp/tensorwise.log" || fail "the FP8 gathers are not logged"
grep -q "their weights gathered in the compute dtype" "$tmp/gathered_bf16.log" || fail "train.fp8_all_gather false is not logged"
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$tmp/$1.jsonl" | tr '\n' ' '; }
[ -n "$(losses tensorwise)" ] && [ "$(losses tensorwise)" = "$(losses gathered_bf16)" ] ||
    fail "FP8 gathers: losses $(losses tensorwise), gathered in the compute dtype $(losses gathered_bf16)"
# The bytes: a layer is 36,864 projection values and 128 norm values, a rank's shard 18,496 values;
# an FP8 layer's gather sends them as codes (1 byte, not the CPU's 4) and the norms as a chunk of
# 128 values; layers 1 and 2, each gathered twice (forward, backward) in the one micro-batch a
# rank takes a step; the scales' gather adds 14 amaxes (4 bytes) a step: 30 x (4 x (18,496 x 3 -
# 128 x 4) - 14 x 4) fewer bytes than gathering the compute dtype.
gathered() { tail -1 "$tmp/$1.jsonl" | sed -n 's/.*"gathered_bytes":\([0-9]*\).*/\1/p'; }
want=$((30 * (4 * (18496 * 3 - 128 * 4) - 14 * 4)))
echo "gathered a rank, 30 steps: $(gathered tensorwise) bytes as FP8 codes, $(gathered gathered_bf16) in the compute dtype"
[ $(($(gathered gathered_bf16) - $(gathered tensorwise))) = "$want" ] ||
    fail "FP8 gathers sent $(gathered tensorwise) bytes, the compute dtype's $(gathered gathered_bf16): not $want fewer"
# 3 workers: other shard bounds, the same bits either way
run w3 --train.precision=fp8 --runtime.workers_per_node=3 --train.global_batch=12
run w3_bf16 --train.precision=fp8 --runtime.workers_per_node=3 --train.global_batch=12 --train.fp8_all_gather=false
[ -n "$(losses w3)" ] && [ "$(losses w3)" = "$(losses w3_bf16)" ] ||
    fail "3 workers, FP8 gathers: losses $(losses w3), gathered in the compute dtype $(losses w3_bf16)"
grep -q "rowwise scales" "$tmp/rowwise.log" || fail "rowwise scales are not logged"
for s in tensorwise rowwise; do
    echo "30 steps: bf16 $(last_loss bf16), $s $(last_loss $s)"
    awk -v a="$(last_loss bf16)" -v b="$(last_loss $s)" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01 * a && a != b) }' ||
        fail "$s: the loss after 30 steps, $(last_loss $s), is not within 1% of bf16's $(last_loss bf16) (or is its bits)"
done
# resumed after step 10's checkpoint: step 30's loss bits
FSDP_FAULTS="worker=0:exit:12" "$fsdpd" "${common[@]}" --train.precision=fp8 --checkpoint.dir="$tmp/ck-resume" \
    --checkpoint.interval_steps=10 --checkpoint.async=false --output.dir="$tmp/out-resume" \
    --runtime.metrics="$tmp/resume.jsonl" > "$tmp/resume1.log" 2>&1 && fail "the run with a dying rank exited 0"
[ -e "$tmp/ck-resume/step-000010" ] || { tail -5 "$tmp/resume1.log"; fail "no checkpoint of step 10"; }
"$fsdpd" "${common[@]}" --train.precision=fp8 --checkpoint.dir="$tmp/ck-resume" --checkpoint.resume=auto \
    --output.dir="$tmp/out-resume" --runtime.metrics="$tmp/resume.jsonl" > "$tmp/resume2.log" 2>&1 ||
    { tail -5 "$tmp/resume2.log"; fail "the FP8 resume failed"; }
[ "$(last_loss resume)" = "$(last_loss tensorwise)" ] || fail "resumed: $(last_loss resume), uninterrupted $(last_loss tensorwise)"
# the plan says what its step time leaves out
"$fsdpctl" plan configs/jobs/tiny-chat.json "${common[@]}" --data.template= --train.precision=fp8 --runtime.backend=cuda --runtime.workers_per_node=1 \
    --checkpoint.dir="$tmp/ck-plan" --output.dir="$tmp/out-plan" --gpus-per-node 1 > "$tmp/plan.txt" 2>&1 ||
    { cat "$tmp/plan.txt"; fail "plan of an FP8 job failed"; }
grep -q "train.precision fp8: the step is predicted at bf16's GEMM rates" "$tmp/plan.txt" ||
    { cat "$tmp/plan.txt"; fail "the plan does not say its FP8 step time is bf16's"; }
# refusals
refused() { # WHAT overrides...
    local what=$1
    shift
    "$fsdpd" "${common[@]}" --train.precision=fp8 --checkpoint.dir="$tmp/ck-bad" --output.dir="$tmp/out-bad" "$@" \
        > "$tmp/bad.log" 2>&1 && fail "accepted: $*"
    grep -q "$what" "$tmp/bad.log" || { tail -3 "$tmp/bad.log"; fail "$*: no '$what'"; }
}
refused "train.precision fp8 with train.type 'lora' is not built yet" --train.type=lora
refused "train.fp8_all_gather with train.fp8_scaling rowwise is not built yet" --train.fp8_scaling=rowwise
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 2
json.dump(c, open(sys.argv[2], "w"))' "$tmp/model.json" "$tmp/two.json"
refused "a model of 2 layers has none to run in FP8" --model.config="$tmp/two.json"
echo "fp8: tensorwise $(last_loss tensorwise), rowwise $(last_loss rowwise), bf16 $(last_loss bf16) after 30 steps; resumed the same bits"
