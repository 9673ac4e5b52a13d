#!/usr/bin/env bash
# fsdpctl plan (F32): a job's memory a GPU, host RAM a node, checkpoint, step time and the
# largest micro_batch that fits, printed and as JSON; other GPUs marked unvalidated; a job that
# cannot fit said so; bad arguments refused, naming them.  (fsdpd's own refusal before loading
# the model is in test_memory_limit.sh.)
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 > "$tmp/plan.txt" || { cat "$tmp/plan.txt"; fail "plan failed"; }
for part in "on 1 node x 2 h200 GPUs (rates measured on this GPU)" "per GPU:" "parameters" "gradients" \
            "optimizer state" "gathered units" "activations" "workspaces" "largest train.micro_batch that fits: 6" \
            "host RAM a node" "checkpoint:" "step:" "tokens/s"; do
    grep -qF -- "$part" "$tmp/plan.txt" || { cat "$tmp/plan.txt"; fail "the plan lacks '$part'"; }
done

# --json: the same, for scripts; what a GPU holds adds up
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --json > "$tmp/plan.json"
python3 - "$tmp/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
g = p["gpu_memory"]
assert g["total"] == g["fsdp"] + g["context"], g
assert g["parameters"] + g["gradients"] + g["optimizer"] + g["gathered"] + g["activations"] + g["workspaces"] - g["context"] <= g["fsdp"], g
assert p["gpu"] == "h200" and p["validated"] is True and p["nodes"] == 1 and p["gpus_per_node"] == 2, p
assert p["step"]["seconds"] > 0 and p["step"]["tokens_per_s"] > 0, p["step"]
assert p["max_micro_batch"] == 6, p["max_micro_batch"]
assert p["checkpoint"]["bytes"] > 0 and p["host_memory"]["total"] >= p["host_memory"]["model"] > 0, p
PY

# a real model: Llama-2-70B QLoRA on one 24 GB card with both offloads fits; a full fine-tune
# does not, and nothing of it does
cat > "$tmp/q70.json" <<JSON
{"model": {"init": "random", "config": "configs/models/llama2-70b.json", "dtype": "bf16"},
 "data": {"path": "$tmp/data.tokens", "format": "tokens", "seq_len": 2048},
 "train": {"type": "qlora", "global_batch": 2, "micro_batch": 2, "max_steps": 10},
 "lora": {"rank": 64, "alpha": 16, "dropout": 0},
 "fsdp": {"activation_checkpointing": "full", "cpu_offload": true, "offload_params": true}}
JSON
"$fsdpctl" plan "$tmp/q70.json" --gpus-per-node 1 --gpu 4090 > "$tmp/q70.txt" || { cat "$tmp/q70.txt"; fail "70B plan failed"; }
grep -q "unvalidated" "$tmp/q70.txt" || fail "a 4090 plan from H200 rates is not marked unvalidated"
grep -q "DOES NOT FIT" "$tmp/q70.txt" && { cat "$tmp/q70.txt"; fail "70B QLoRA with offload does not fit a 24 GB card"; }
"$fsdpctl" plan "$tmp/q70.json" --gpus-per-node 1 --gpu 4090 --train.type=full --fsdp.cpu_offload=false \
    --fsdp.offload_params=false > "$tmp/f70.txt"
grep -q "DOES NOT FIT" "$tmp/f70.txt" && grep -q "largest train.micro_batch that fits: 0" "$tmp/f70.txt" ||
    { cat "$tmp/f70.txt"; fail "a 70B full fine-tune on one 4090 was not found unfit"; }

# bad arguments
expect_error 1 "--gpu 'v100' is none of h200, h100, a100-80" "$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --gpu v100
expect_error 1 "$tmp/none.json" "$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --rates "$tmp/none.json"
expect_error 2 "--nodes '0' is out of range" "$fsdpctl" plan "$tmp/job.json" --nodes 0
expect_error 2 "usage: fsdpctl plan" "$fsdpctl" plan
echo '{"format": "fsdpd-plan-rates/1"}' > "$tmp/bad-rates.json"
expect_error 1 "bad-rates.json" "$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --rates "$tmp/bad-rates.json"
echo "plan: ok"
