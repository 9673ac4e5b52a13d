#!/usr/bin/env bash
# Qwen2 (q/k/v biases), Qwen3 (q_norm/k_norm, head_dim 12 apart from hidden 36 / 4 heads, so
# q_proj is [48, 36], tied embeddings) and Mistral (sliding window 8 over sequences of 20)
# trained end to end by fsdpd on the CPU backend (F43): for each, a full fine-tune, LoRA and
# QLoRA give the same parameters or adapters on 1 and 2 workers (1e-5); the full run trains
# the biases and q/k norms; its consolidated directory has the family's own config.json
# (model_type, architectures) and its weights under the family's names; a bnb-4bit Qwen2
# directory (fsdpctl quantize: biases kept as they are) trains as the NF4-at-load base does.
source "$(dirname "$0")/lib.sh"

write_base_job full
family_model() { # FAMILY: $tmp/model.json of a small model of that family
    case $1 in
    qwen2) extra='"model_type": "qwen2", "hidden_size": 40, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                  "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 2' ;;
    qwen3) extra='"model_type": "qwen3", "hidden_size": 36, "head_dim": 12, "tie_word_embeddings": true,
                  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": false' ;;
    mistral) extra='"model_type": "mistral", "hidden_size": 36, "head_dim": 10, "sliding_window": 8,
                    "rms_norm_eps": 1e-5, "rope_theta": 10000.0' ;;
    esac
    cat > "$tmp/model.json" <<JSON
{$extra, "intermediate_size": 70, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 61, "max_position_embeddings": 64,
 "bos_token_id": 1, "eos_token_id": 2}
JSON
}
# run NAME -- overrides: run_job with the final parameters in $tmp/NAME.safetensors
run() {
    local name=$1
    shift
    run_job "$name" "final_params=$tmp/$name.safetensors" "$@"
    must_succeed "$name"
}
# same A B WHAT: every tensor within 1e-5, but k_proj's bias within 1e-3: its gradient nearly
# cancels (a bias added to every key would shift all of a query's scores alike, were it not
# for RoPE: 450 times smaller than v_proj's in the Qwen2 golden), so the summation order of 1
# or 2 workers shows in it, and AdamW's m / sqrt(v) passes that on.
same() {
    "$fsdpctl" compare "$tmp/$1.safetensors" "$tmp/$2.safetensors" --rtol 1e-5 > "$tmp/cmp.out" || true
    awk '/ tensors compared, / { done = 1 } / > rtol$/ { if ($1 !~ /k_proj\.bias$/ || $(NF - 2) > 1e-3) bad = 1 }
         END { exit bad || !done }' "$tmp/cmp.out" || { cat "$tmp/cmp.out"; fail "$3: 1 and 2 workers trained other parameters"; }
}
lora=(--train.type=lora --lora.rank=4 --lora.alpha=8 --lora.dropout=0.1 --lora.targets=all-linear)

for family in qwen2 qwen3 mistral; do
    family_model "$family"
    rm -rf "$tmp/base"
    "$fsdpctl" init --model-config "$tmp/model.json" --out "$tmp/base" --seed 5 > /dev/null
    "$fsdpctl" inspect "$tmp/base" > "$tmp/$family-base.txt"
    grep -q "^family            $family " "$tmp/$family-base.txt" || { cat "$tmp/$family-base.txt"; fail "$family: not read as $family"; }

    # --- full fine-tune, 2 and 1 workers; the 1-worker run consolidated ------------------------
    run "$family-full2" -- --checkpoint.dir="$tmp/$family-ck1"
    run "$family-full1" -- --checkpoint.dir="$tmp/$family-ck2" --runtime.workers_per_node=1 \
        --output.consolidate=true --output.dir="$tmp/$family-out" --output.dtype=f32
    same "$family-full1" "$family-full2" "$family full"
    out=$tmp/$family-out
    python3 - "$out/config.json" "$family" <<'PY' || fail "$family: the consolidated config.json is not the family's"
import json, sys
c = json.load(open(sys.argv[1]))
arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}[sys.argv[2]]
assert c["model_type"] == sys.argv[2] and c["architectures"] == [arch], (c["model_type"], c["architectures"])
if sys.argv[2] == "mistral": assert c["sliding_window"] == 8, c["sliding_window"]
if sys.argv[2] == "qwen3": assert c["head_dim"] == 12 and c["tie_word_embeddings"] is True
if sys.argv[2] == "qwen2": assert c["use_sliding_window"] is False
PY
    "$fsdpctl" inspect "$out" > "$tmp/$family-out.txt" || { cat "$tmp/$family-out.txt"; fail "$family: the consolidated directory does not inspect"; }
    "$fsdpctl" compare "$out" "$tmp/$family-full1.safetensors" --rtol 0 > "$tmp/cmp.out" ||
        { cat "$tmp/cmp.out"; fail "$family: the consolidated weights are not the final ones"; }
    # the extras trained: biases from 0, q/k norms from 1
    case $family in
    qwen2) extra=model.layers.1.self_attn.v_proj.bias ;;
    qwen3) extra=model.layers.0.self_attn.k_norm.weight ;;
    mistral) extra=model.layers.0.self_attn.q_proj.weight ;;
    esac
    grep -q "^  $extra " "$tmp/$family-out.txt" || fail "$family: $extra is not in the output"
    "$fsdpctl" compare "$tmp/base" "$out" --rtol 1e-3 > "$tmp/cmp.out" && fail "$family: training moved nothing"
    grep "^$extra " "$tmp/cmp.out" | grep -q '> rtol' || { cat "$tmp/cmp.out"; fail "$family: $extra did not train"; }

    # --- LoRA and QLoRA, 2 and 1 workers ---------------------------------------------------------
    run "$family-lora2" -- --checkpoint.dir="$tmp/$family-ck3" "${lora[@]}"
    run "$family-lora1" -- --checkpoint.dir="$tmp/$family-ck4" "${lora[@]}" --runtime.workers_per_node=1 \
        --output.consolidate=true --output.merge=true --output.dir="$tmp/$family-lout"
    same "$family-lora1" "$family-lora2" "$family LoRA"
    # what LoRA trains is the adapters only: the biases and norms stay frozen (PEFT's bias "none")
    grep -q '^28 tensors compared' "$tmp/cmp.out" && ! grep -q '\.bias \|norm\.weight ' "$tmp/cmp.out" ||
        { cat "$tmp/cmp.out"; fail "$family LoRA: more than the adapters were trained"; }
    # the merged model is the family's, its biases and norms the base's
    grep -q "\"model_type\": \"$family\"" "$tmp/$family-lout/merged/config.json" ||
        { cat "$tmp/$family-lout/merged/config.json"; fail "$family: the merged model's config.json is not the family's"; }
    "$fsdpctl" compare "$tmp/$family-lout/merged" "$tmp/base" --rtol 0 > "$tmp/cmp.out" || true
    awk '/ > rtol$/ && ($1 ~ /bias$/ || $1 ~ /norm\.weight$/) { bad = 1 } / tensors compared/ { done = 1 }
         END { exit bad || !done }' "$tmp/cmp.out" || { cat "$tmp/cmp.out"; fail "$family: merging changed a bias or norm"; }
    grep -q 'q_proj.weight .* > rtol$' "$tmp/cmp.out" || { cat "$tmp/cmp.out"; fail "$family: nothing was merged"; }
    run "$family-qlora2" -- --checkpoint.dir="$tmp/$family-ck5" "${lora[@]}" --train.type=qlora
    grep -q 'quantized to NF4' "$tmp/$family-qlora2.log" || fail "$family: the QLoRA base was not quantized"
    run "$family-qlora1" -- --checkpoint.dir="$tmp/$family-ck6" "${lora[@]}" --train.type=qlora --runtime.workers_per_node=1
    same "$family-qlora1" "$family-qlora2" "$family QLoRA"
    join "$tmp/$family-lora2.loss" "$tmp/$family-qlora2.loss" | awk '$2 != $3 { d = 1 } END { exit !d }' ||
        fail "$family: NF4 changed no loss"
    # a random base from a config.json that names no class: the output names the family's
    run "$family-random" -- --checkpoint.dir="$tmp/$family-ck7" --model.path= --model.init=random \
        --model.config="$tmp/model.json" --train.max_steps=1 --output.consolidate=true --output.dir="$tmp/$family-rout"
    grep -q '"architectures"' "$tmp/model.json" && fail "the model config names a class"
    python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))
a = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}[sys.argv[2]]
got = c["architectures"]
sys.exit(None if got == [a] else f"architectures {got}, not [{a}]")' \
        "$tmp/$family-rout/config.json" "$family" || fail "$family: a random base consolidated under another class"
    echo "$family: full, LoRA and QLoRA on 1 and 2 workers agree; consolidated as $(sed -n 's/^family *//p' "$tmp/$family-out.txt")"
done

# --- a bnb-4bit Qwen2 directory (its biases unquantized) trains as NF4 at load does ------------
family_model qwen2
rm -rf "$tmp/base" && "$fsdpctl" init --model-config "$tmp/model.json" --out "$tmp/base" --seed 5 > /dev/null
"$fsdpctl" quantize "$tmp/base" "$tmp/base-bnb4" > /dev/null
"$fsdpctl" inspect "$tmp/base-bnb4" > "$tmp/bnb4.txt" 2>&1 || true # its linears are packed: not the config's shapes
grep -q '^  model.layers.0.self_attn.q_proj.bias  *F32  *\[40\]$' "$tmp/bnb4.txt" || { cat "$tmp/bnb4.txt"; fail "the bnb-4bit directory lost q_proj.bias"; }
run qbnb -- --checkpoint.dir="$tmp/ckqb" "${lora[@]}" --train.type=qlora --model.path="$tmp/base-bnb4"
grep -q 'NF4 as saved' "$tmp/qbnb.log" || fail "the bnb-4bit base was not loaded as saved"
join "$tmp/qwen2-qlora2.loss" "$tmp/qbnb.loss" | awk '$2 != $3 { d = 1 } END { exit d }' ||
    fail "the bnb-4bit Qwen2 trains other losses than NF4 at load"
echo "families: ok"
