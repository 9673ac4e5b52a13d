#!/usr/bin/env bash
# fsdpctl plan (F32): a job's memory a GPU, host RAM a node, checkpoint, step time and the
# largest micro_batch that fits, printed and as JSON; other GPUs marked unvalidated; a job that
# cannot fit said so; bad arguments refused, naming them.  (fsdpd's own refusal before loading
# the model is in test_memory_limit.sh.)
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --runtime.backend=cuda > "$tmp/plan.txt" || { cat "$tmp/plan.txt"; fail "plan failed"; }
for part in "on 1 node x 2 h200 GPUs, 2 workers a node (rates measured on this GPU)" "per GPU:" "parameters" "gradients" \
            "optimizer state" "gathered units" "activations" "workspaces" "largest train.micro_batch that fits: 6" \
            "host RAM a node" "checkpoint:" "step:" "tokens/s"; do
    grep -qF -- "$part" "$tmp/plan.txt" || { cat "$tmp/plan.txt"; fail "the plan lacks '$part'"; }
done

# --json: the same, for scripts; what a GPU holds adds up
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --runtime.backend=cuda --json > "$tmp/plan.json"
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

# compute copies: one GPU's whole model keeps its bf16 copy where it fits (said, and in the
# JSON); two GPUs sharding it do not, nor a limit that leaves no room for them
grep -q "compute copies" "$tmp/plan.txt" && { cat "$tmp/plan.txt"; fail "2 sharding workers planned compute copies"; }
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 1 --runtime.workers_per_node=1 --runtime.backend=cuda > "$tmp/plan1.txt"
grep -q "compute copies: the trained weights in bf16 beside their masters" "$tmp/plan1.txt" ||
    { cat "$tmp/plan1.txt"; fail "one GPU's plan has no compute copies"; }
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 1 --runtime.workers_per_node=1 --runtime.backend=cuda --json |
    python3 -c 'import json, sys; p = json.load(sys.stdin); assert p["compute_copies"] is True, p' ||
    fail "the JSON plan lacks compute_copies"
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --runtime.backend=cuda --json |
    python3 -c 'import json, sys; p = json.load(sys.stdin); assert p["compute_copies"] is False, p' ||
    fail "the JSON plan of 2 sharding workers has compute_copies"

# spare nodes hold no rank: 3 nodes of which 1 a spare plan 2 nodes' world
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --nodes 3 --runtime.backend=cuda --runtime.spare_nodes=1 --json \
    > "$tmp/plan-spare.json"
python3 - "$tmp/plan-spare.json" "$tmp/plan.json" <<'PY'
import json, sys
p, one = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert p["nodes"] == 2 and p["spare_nodes"] == 1 and one["spare_nodes"] == 0, p
PY
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --nodes 3 --runtime.backend=cuda --runtime.spare_nodes=1 > "$tmp/plan-spare.txt"
grep -q "fsdpctl plan: 2 of the 3 nodes train; 1 wait as spares (runtime.spare_nodes)" "$tmp/plan-spare.txt" ||
    { cat "$tmp/plan-spare.txt"; fail "the plan does not say the spares"; }
expect_error 1 "runtime.spare_nodes: 3 spare(s) of --nodes 3 leave none to train" "$fsdpctl" plan "$tmp/job.json" \
    --gpus-per-node 2 --nodes 3 --runtime.spare_nodes=3

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
"$fsdpctl" plan "$tmp/q70.json" --gpus-per-node 1 --gpu 4090 --train.type=full --lora.rank=8 --lora.dropout=0.05 --fsdp.cpu_offload=false \
    --fsdp.offload_params=false > "$tmp/f70.txt"
grep -q "DOES NOT FIT" "$tmp/f70.txt" && grep -q "largest train.micro_batch that fits: 0" "$tmp/f70.txt" ||
    { cat "$tmp/f70.txt"; fail "a 70B full fine-tune on one 4090 was not found unfit"; }

# the families' parameters counted exactly (F43): a full fine-tune's checkpoint is 12 bytes (fp32
# master, m, v) for each of the published parameters, Qwen2's biases and Qwen3's q/k norms
# included, a tied head's embedding once
for m in qwen2.5-7b:7615616512 qwen2.5-72b:72706203648 qwen3-8b:8190735360 mistral-7b-v0.3:7248023552 \
         llama3.1-8b:8030261248; do
    "$fsdpctl" plan "$tmp/job.json" --model.init=random --model.config="configs/models/${m%:*}.json" --data.seq_len=64 \
        --json > "$tmp/fam.json" || { cat "$tmp/fam.json"; fail "${m%:*}: plan failed"; }
    python3 -c 'import json, sys; b = json.load(open(sys.argv[1]))["checkpoint"]["bytes"]
if b != 12 * int(sys.argv[2]): sys.exit(f"checkpoint {b} bytes, not 12 x {sys.argv[2]}")' "$tmp/fam.json" "${m#*:}" ||
        fail "${m%:*}: the plan does not count its parameters"
done
python3 - "$tmp/model.json" "$tmp/tied.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.update(model_type="qwen3", tie_word_embeddings=True); json.dump(c, open(sys.argv[2], "w"))
PY
"$fsdpctl" plan "$tmp/job.json" --model.config="$tmp/tied.json" --json > "$tmp/tied-plan.json"
python3 -c 'import json, sys; b = json.load(open(sys.argv[1]))["checkpoint"]["bytes"]
# 36 hidden, 70 ffn, 2 layers, 4 heads / 2 kv of 10, vocab 61: embed + 2 x (layer + q/k norms) + norm
n = 61 * 36 + 2 * (36 * 40 + 2 * 36 * 20 + 40 * 36 + 3 * 36 * 70 + 2 * 36 + 2 * 10) + 36
if b != 12 * n: sys.exit(f"checkpoint {b} bytes, not 12 x {n}")' "$tmp/tied-plan.json" || fail "a tied Qwen3 is not counted exactly"

# Mistral 7B v0.1's window of 4096 over 8192 tokens: the attention costs the band's share of the
# causal pairs, (4096 x 8192 - 4096 x 4095 / 2) / (8192 x 8193 / 2)
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["sliding_window"] = 4096; json.dump(c, open(sys.argv[2], "w"))' \
    configs/models/mistral-7b-v0.3.json "$tmp/mistral-v0.1.json"
for m in mistral-7b-v0.3.json:nowindow "$tmp/mistral-v0.1.json":window; do
    cfg=${m%:*}; [ "${cfg#/}" = "$cfg" ] && cfg=configs/models/$cfg
    "$fsdpctl" plan "$tmp/job.json" --model.init=random --model.config="$cfg" --data.seq_len=8192 \
        --train.micro_batch=1 --train.global_batch=8 --runtime.backend=cuda --json > "$tmp/${m#*:}.json" ||
        { cat "$tmp/${m#*:}.json"; fail "mistral plan failed"; }
done
python3 -c 'import json, sys
a, b = (json.load(open(f))["step"]["attention_s"] for f in sys.argv[1:3])
share = (4096 * 8192 - 4096 * 4095 / 2) / (8192 * 8193 / 2)
if abs(b / a - share) > 1e-9: sys.exit(f"windowed attention {b} s, without {a} s: ratio {b / a}, not {share}")' \
    "$tmp/nowindow.json" "$tmp/window.json" || fail "the plan does not count the window"

# a preference objective (F49): a micro-batch of pairs is twice the rows; full DPO's reference,
# the frozen copy of the start weights, is in the parameters and its forward in the step
pref=(--runtime.backend=cuda --gpus-per-node 2 --model.init=random --model.config=configs/models/llama2-7b.json
      --data.seq_len=2048 --train.global_batch=4 --train.micro_batch=1 --train.type=full)
"$fsdpctl" plan "$tmp/job.json" "${pref[@]}" --train.objective=dpo > "$tmp/dpo.txt" || { cat "$tmp/dpo.txt"; fail "DPO plan failed"; }
for part in "train.objective dpo: a micro-batch of 1 pair is 2 rows; the reference, a frozen copy of the start weights" \
            "of which DPO's reference forward (no backward) and its gathers:"; do
    grep -qF -- "$part" "$tmp/dpo.txt" || { cat "$tmp/dpo.txt"; fail "the DPO plan lacks '$part'"; }
done
"$fsdpctl" plan "$tmp/job.json" "${pref[@]}" --train.objective=dpo --json > "$tmp/dpo.json"
"$fsdpctl" plan "$tmp/job.json" "${pref[@]}" --train.micro_batch=2 --train.global_batch=8 --json > "$tmp/sft2.json"
python3 - "$tmp/dpo.json" "$tmp/sft2.json" <<'PY' || fail "the DPO plan does not count its pairs and its reference"
import json, sys
d, s = (json.load(open(f)) for f in sys.argv[1:])
assert d["gpu_memory"]["activations"] == s["gpu_memory"]["activations"], (d["gpu_memory"], s["gpu_memory"])
assert d["gpu_memory"]["parameters"] > s["gpu_memory"]["parameters"] + 6 * 2**30 // 2, (d["gpu_memory"], s["gpu_memory"])
assert s["step"]["reference_s"] == 0 and d["step"]["reference_s"] > 0, (d["step"], s["step"])
assert d["step"]["seconds"] > s["step"]["seconds"] + d["step"]["reference_s"] * 0.9, (d["step"], s["step"])
assert abs(d["step"]["tokens_per_s"] - 8 * 2048 / d["step"]["seconds"]) < 1e-6 * d["step"]["tokens_per_s"], d["step"]
PY

# data.seq_len past max_position_embeddings (F46): refused by plan and by fsdpd, naming both
# numbers, unless the config's RoPE scaling covers it (yarn factor 2 from 64: 128 positions)
expect_error 1 "data.seq_len 65 is longer than the 64 positions $tmp/model.json covers (max_position_embeddings 64" \
    "$fsdpctl" plan "$tmp/job.json" --data.seq_len=65
expect_status 1 "data.seq_len 65 is longer than the 64 positions" "$fsdpd" --job "$tmp/job.json" --data.seq_len=65
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0}
json.dump(c, open(sys.argv[2], "w"))' "$tmp/model.json" "$tmp/yarn.json"
"$fsdpctl" plan "$tmp/job.json" --model.config="$tmp/yarn.json" --data.seq_len=128 > "$tmp/yarn.txt" ||
    { cat "$tmp/yarn.txt"; fail "yarn factor 2 does not cover 128 positions"; }
expect_error 1 "data.seq_len 129 is longer than the 128 positions" \
    "$fsdpctl" plan "$tmp/job.json" --model.config="$tmp/yarn.json" --data.seq_len=129

# --longest (F46): the longest data.seq_len fsdpd admits, up to the positions the config covers:
# all 64 without a limit; under the limit that a 32-token job's plan just fits, at least 32,
# the plan at it fits and one token more does not
"$fsdpctl" plan "$tmp/job.json" --longest > "$tmp/longest.txt" || { cat "$tmp/longest.txt"; fail "plan --longest failed"; }
grep -q "^longest data.seq_len that fits: 64 (the config covers 64 positions)$" "$tmp/longest.txt" ||
    { cat "$tmp/longest.txt"; fail "plan --longest without a limit is not the 64 positions"; }
lim=$("$fsdpctl" plan "$tmp/job.json" --data.seq_len=32 --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["gpu_memory"]["fsdp"])')
"$fsdpctl" plan "$tmp/job.json" --runtime.gpu_memory_limit="$lim" --longest --json > "$tmp/longest.json"
longest=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["longest_seq_len"])' "$tmp/longest.json")
[ "$longest" -ge 32 ] && [ "$longest" -lt 64 ] || fail "plan --longest under a 32-token limit: $longest"
"$fsdpctl" plan "$tmp/job.json" --runtime.gpu_memory_limit="$lim" --data.seq_len="$longest" | grep -q "DOES NOT FIT" &&
    fail "the longest data.seq_len $longest does not fit"
"$fsdpctl" plan "$tmp/job.json" --runtime.gpu_memory_limit="$lim" --data.seq_len=$((longest + 1)) | grep -q "DOES NOT FIT" ||
    fail "one token past the longest data.seq_len $longest fits"

# plan and fsdpd give one verdict (F37): runtime.gpu_memory_limit of 1 byte does not fit, with
# fsdpd's own reason, on the GPU and on the CPU backend; fsdpd refuses the same job the same way
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --runtime.backend=cuda --runtime.gpu_memory_limit=1 > "$tmp/lim.txt"
grep -q "^per GPU: .*: DOES NOT FIT$" "$tmp/lim.txt" && grep -q "fsdpd refuses it: runtime.gpu_memory_limit: each worker needs" "$tmp/lim.txt" ||
    { cat "$tmp/lim.txt"; fail "a 1-byte gpu_memory_limit was not found unfit"; }
grep -q "largest train.micro_batch that fits: 0" "$tmp/lim.txt" || { cat "$tmp/lim.txt"; fail "a micro_batch fits in 1 byte"; }
"$fsdpctl" plan "$tmp/job.json" --runtime.gpu_memory_limit=1 > "$tmp/limcpu.txt"
grep -q "^per worker: .*: DOES NOT FIT$" "$tmp/limcpu.txt" || { cat "$tmp/limcpu.txt"; fail "cpu: 1 byte fits"; }
"$fsdpd" --job "$tmp/job.json" --runtime.gpu_memory_limit=1 > "$tmp/limfsdpd.log" 2>&1 && fail "fsdpd admitted a job of 1 byte"
why=$(sed -n 's/^  fsdpd refuses it: //p' "$tmp/limcpu.txt")
[ -n "$why" ] && grep -qF -- "$why" "$tmp/limfsdpd.log" ||
    { cat "$tmp/limcpu.txt" "$tmp/limfsdpd.log"; fail "plan and fsdpd refuse for different reasons"; }
"$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --runtime.backend=cuda > "$tmp/fits.txt"
grep -q "DOES NOT FIT\|fsdpd refuses" "$tmp/fits.txt" && { cat "$tmp/fits.txt"; fail "the small job does not fit an h200"; }

# runtime.workers_per_node and runtime.backend are the job's (F37), not overwritten
"$fsdpctl" plan "$tmp/job.json" --runtime.backend=cuda --runtime.workers_per_node=1 --json > "$tmp/w1.json"
python3 - "$tmp/w1.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["backend"] == "cuda" and p["workers_per_node"] == 1 and p["gpus_per_node"] == 8 and p["fits"] is True, p
assert p["max_micro_batch"] == 12, p["max_micro_batch"]  # global_batch 12 on one rank
PY
expect_error 1 "runtime.workers_per_node: 4 workers on 2 GPUs a node share them" \
    "$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --runtime.backend=cuda --runtime.workers_per_node=4
# the CPU backend (the job's): the workers' memory in host RAM, no step time
"$fsdpctl" plan "$tmp/job.json" > "$tmp/cpu.txt" || { cat "$tmp/cpu.txt"; fail "cpu plan failed"; }
grep -q "on 1 node x 2 workers, CPU backend (memory and host RAM; no step time)" "$tmp/cpu.txt" &&
    grep -q "the workers' memory" "$tmp/cpu.txt" && ! grep -q "^step:" "$tmp/cpu.txt" && ! grep -q "GPU" "$tmp/cpu.txt" ||
    { cat "$tmp/cpu.txt"; fail "the CPU backend's plan"; }
"$fsdpctl" plan "$tmp/job.json" --runtime.workers_per_node=3 --train.global_batch=18 --json > "$tmp/cpu.json"
python3 - "$tmp/cpu.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["backend"] == "cpu" and p["workers_per_node"] == 3 and p["gpu"] is None and p["step"] is None, p
h = p["host_memory"]
assert h["workers"] == 3 * p["gpu_memory"]["fsdp"] > 0 and p["gpu_memory"]["context"] == 0, p
assert h["total"] == sum(h[k] for k in ("model", "offloaded", "workers", "checkpoint_staging", "token_cache", "processes")), h
PY

# bad arguments
expect_error 1 "--gpu 'v100' is none of h200, h100, a100-80" "$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --gpu v100
expect_error 1 "$tmp/none.json" "$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --rates "$tmp/none.json"
expect_error 2 "--nodes '0' is out of range" "$fsdpctl" plan "$tmp/job.json" --nodes 0
expect_error 2 "usage: fsdpctl plan" "$fsdpctl" plan
echo '{"format": "fsdpd-plan-rates/1"}' > "$tmp/bad-rates.json"
expect_error 1 "bad-rates.json" "$fsdpctl" plan "$tmp/job.json" --gpus-per-node 2 --rates "$tmp/bad-rates.json"
echo "plan: ok"
