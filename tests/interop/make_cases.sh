#!/usr/bin/env bash
# Makes the cases tests/interop/check_transformers.py checks on the device machine: for each
# small model, a real CPU training run (fsdpd, a few workers) consolidated by fsdpd itself
# (bf16, output.dir) and by `fsdpctl consolidate --dtype f32`, with the golden batch and what
# `fsdpctl reference` computes on the f32 directory.  Usage (repository root, after make):
#   FSDP_BUILD=build tests/interop/make_cases.sh dev-carry/interop
# Each case DIR/<name>/ holds f32/ (the model), bf16/ (fsdpd's output.dir), batch.safetensors
# and reference.safetensors (logits, loss).
source "$(dirname "$0")/../integration/lib.sh"
out=${1:?usage: make_cases.sh OUT_DIR}
case "$out" in /*) ;; *) out="$OLDPWD/$out" ;; esac
batch=$fixtures/golden/tiny-mha/batch.safetensors # input_ids, labels: int32 [2, 33], vocab 211
rm -rf "$out"
mkdir -p "$out"

# case NAME WORKERS MICRO: trains $tmp/NAME/model.json and fills $out/NAME.
case_run() {
    local name=$1 workers=$2 micro=$3 d=$tmp/$1
    mkdir -p "$out/$name"
    "$fsdpctl" synth --out "$d/data.tokens" --records 96 --seq-len 20 --vocab 211 --alphabet 12 \
        --seed 7 > /dev/null
    write_job "$d/job.json" "$d/model.json" "$d/data.tokens"
    "$fsdpd" --job "$d/job.json" --runtime.workers_per_node="$workers" --train.micro_batch="$micro" \
        --output.dir="$out/$name/bf16" > "$d/train.log" 2>&1 || { cat "$d/train.log"; fail "$name: training failed"; }
    rm "$out/$name/bf16/metrics.jsonl"
    "$fsdpctl" consolidate "$d/ckpt" "$out/$name/f32" --dtype f32 --shard-size 50KB > /dev/null
    cp "$batch" "$out/$name/batch.safetensors"
    OPENBLAS_NUM_THREADS=1 "$fsdpctl" reference "$out/$name/f32" "$batch" \
        --out "$out/$name/reference.safetensors" > /dev/null
    echo "$name: $(ls "$out/$name/f32" | tr '\n' ' ')"
}

# GQA, head_dim 10 (not hidden / heads), untied, several safetensors files.
make_small_model "$tmp/gqa"
sed -i 's/"vocab_size": 61/"vocab_size": 211/' "$tmp/gqa/model.json"
case_run gqa 3 2

# Tied embeddings: no lm_head.weight in the files.
make_small_model "$tmp/tied" true
sed -i 's/"vocab_size": 61/"vocab_size": 211/' "$tmp/tied/model.json"
case_run tied 2 3

# Llama 3 RoPE scaling in the newer rope_parameters spelling, multi-head attention.
mkdir -p "$tmp/llama3"
cat > "$tmp/llama3/model.json" <<JSON
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 211,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
 "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
   "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
 "bos_token_id": 1, "eos_token_id": 2}
JSON
case_run llama3 2 3

# F43, the other families (batch rows of 33 tokens): Qwen2 with q/k/v biases and rope_theta 1e6;
# Qwen3 with q_norm/k_norm, head_dim 12 apart from hidden 36 / 4 heads, tied embeddings;
# Mistral with a sliding window of 12, shorter than the rows.  Each is loaded as its own class
# (check_transformers.py checks the class against config.json's architectures).
family_case() { # NAME JSON_MEMBERS
    mkdir -p "$tmp/$1"
    cat > "$tmp/$1/model.json" <<JSON
{$2, "intermediate_size": 70, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 211, "max_position_embeddings": 64,
 "bos_token_id": 1, "eos_token_id": 2}
JSON
    case_run "$1" 2 3
}
family_case qwen2 '"model_type": "qwen2", "hidden_size": 40, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 2'
family_case qwen3 '"model_type": "qwen3", "hidden_size": 36, "head_dim": 12, "tie_word_embeddings": true,
 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": false'
family_case mistral '"model_type": "mistral", "hidden_size": 36, "head_dim": 10, "sliding_window": 12,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0'
# A bnb-4bit Qwen2 directory (fsdpctl quantize, fp32 compute: the linears NF4 with double quantization, the
# biases and norms as they are), what fsdpctl reference --quant nf4 computes from the f32 one.
"$fsdpctl" quantize "$out/qwen2/f32" "$out/qwen2/bnb4" --compute-dtype f32 > /dev/null
OPENBLAS_NUM_THREADS=1 "$fsdpctl" reference "$out/qwen2/f32" "$batch" --quant nf4 \
    --out "$out/qwen2/reference_nf4.safetensors" > /dev/null
echo "qwen2: bnb4/ $(ls "$out/qwen2/bnb4" | tr '\n' ' ')"
