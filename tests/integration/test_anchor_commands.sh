#!/usr/bin/env bash
# The anchors' command lines (../shared/anchors/commands.md, F40), each as its users type it with
# only the program name changed: it stops at start with exactly the refusal its mapping defines (a
# hub id, --world_size, --log_to wandb), and run again with only the refused flags
# changed as the message says (a local path for a hub id), it trains on the CPU backend, and its
# resolved job (OUTPUT_DIR/job.json) holds what its flags mean, with its tool's defaults.
source "$(dirname "$0")/lib.sh"

fsdpd=$(cd "$(dirname "$fsdpd")" && pwd)/fsdpd
fsdpctl=$(cd "$(dirname "$fsdpctl")" && pwd)/fsdpctl
export TMPDIR=$tmp XDG_RUNTIME_DIR=
unset SLURM_JOB_ID
repo=$(pwd)
cd "$tmp"

# A tiny Llama of the sp32k tokenizer (Llama 2's), 2048 positions; alpaca, guanaco-style text and
# the blog's "content" records.
python3 - "$repo" <<'EOF'
import json, random, sys
random.seed(3)
c = json.load(open(sys.argv[1] + "/configs/models/tiny-sp32k/config.json"))
c.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
         num_key_value_heads=1, head_dim=16, max_position_embeddings=2048)
json.dump(c, open("cfg.json", "w"))
def alpaca(path, n):
    with open(path, "w") as f:
        for i in range(n):
            a, b = random.randint(1, 50), random.randint(1, 50)
            f.write(json.dumps({"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a + b}"}) + "\n")
alpaca("alpaca8.jsonl", 8)
alpaca("alpaca64.jsonl", 64)
with open("guanaco.jsonl", "w") as f:
    for i in range(32):
        f.write(json.dumps({"text": f"### Human: What is {i} + 1?### Assistant: {i + 1}."}) + "\n")
with open("content.jsonl", "w") as f:
    for i in range(800):
        f.write(json.dumps({"content": f"<|system|> be brief <|endoftext|> <|prompter|> what is {i} + 2? "
                                       f"<|endoftext|> <|assistant|> {i + 2} <|endoftext|>"}) + "\n")
EOF
"$fsdpctl" init --model-config cfg.json --out Llama-2-7b-hf --seed 1 > /dev/null
cp "$repo/configs/models/tiny-sp32k/tokenizer.json" Llama-2-7b-hf/

# line NAME ARGS...: fsdpd ARGS; $status, the log in NAME.log
line() {
    local name=$1
    shift
    status=0
    "$fsdpd" "$@" > "$name.log" 2>&1 || status=$?
}
refused() { # NAME NEEDLE: the line stopped at start (exit 2) naming the refused flag
    [ "$status" -eq 2 ] || { cat "$1.log"; fail "$1: exited $status, expected the refusal (2)"; }
    grep -qF -- "$2" "$1.log" || { cat "$1.log"; fail "$1: the refusal does not say: $2"; }
    ! grep -q "all .* workers ready" "$1.log" || fail "$1: trained before refusing"
}
trained() { # NAME
    [ "$status" -eq 0 ] || { cat "$1.log"; fail "$1: exited $status"; }
    grep -q "^step 1/" "$1.log" || { cat "$1.log"; fail "$1: no step"; }
}
# resolved FILE KEY VALUE: the job.json's section.key is VALUE (as JSON)
resolved() {
    python3 -c '
import json, sys
job = json.load(open(sys.argv[1]))
section, key = sys.argv[2].split(".")
have, want = job[section][key], json.loads(sys.argv[3])
if have != want: sys.exit(f"{sys.argv[1]}: {sys.argv[2]} is {have!r}, expected {want!r}")' "$@" || fail "resolved job"
}

# --- fsdp_qlora's README: Llama-2-70B QLoRA on two 24 GB cards ---------------------------------
line qlora70 --model_name meta-llama/Llama-2-70b-hf --batch_size 2 --context_length 2048 \
    --precision bf16 --train_type qlora --use_gradient_checkpointing true --use_cpu_offload true \
    --dataset alpaca --reentrant_checkpointing true
refused qlora70 "--model_name: 'meta-llama/Llama-2-70b-hf' looks like a Hugging Face hub id and is no directory here; fsdpd loads local model directories"
line qlora70 --model_name Llama-2-7b-hf --batch_size 2 --context_length 2048 \
    --precision bf16 --train_type qlora --use_gradient_checkpointing true --use_cpu_offload true \
    --dataset alpaca --reentrant_checkpointing true
refused qlora70 "--dataset: 'alpaca' is a data set name of fsdp_qlora's, which downloads it; fsdpd trains on a file: give its path"
line qlora70 --model_name Llama-2-7b-hf --batch_size 2 --context_length 2048 \
    --precision bf16 --train_type qlora --use_gradient_checkpointing true --use_cpu_offload true \
    --dataset alpaca8.jsonl --reentrant_checkpointing true
trained qlora70
grep -q "note: defaults: fsdp_qlora's (the command line uses its flags" qlora70.log || fail "the defaults chosen are not said"
grep -q "note: --reentrant_checkpointing true: no meaning in fsdpd" qlora70.log || fail "--reentrant_checkpointing not explained"
grep -q "note: --precision bf16: fsdpd computes in bf16 on GPUs" qlora70.log || fail "--precision not explained"
grep -q "data.format auto: alpaca" qlora70.log || fail "the alpaca records were not recognised"
j=output/job.json
resolved $j train.defaults '"fsdp_qlora"'
resolved $j train.type '"qlora"'
resolved $j train.micro_batch 2
resolved $j train.global_batch 4 # 2 a rank x 1 x 2 ranks
resolved $j data.seq_len 2048
resolved $j data.format '"alpaca"'
resolved $j fsdp.activation_checkpointing '"full"'
resolved $j fsdp.cpu_offload true
resolved $j fsdp.offload_params true
resolved $j train.lr 1e-5
resolved $j train.schedule '"constant"'
resolved $j train.clip_norm 0.0
resolved $j train.weight_decay 0.1
resolved $j train.seed 42
resolved $j lora.rank 64
resolved $j lora.alpha 16.0
resolved $j lora.dropout 0.1
resolved $j lora.targets '["k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj"]'
resolved $j checkpoint.dir '"output.checkpoints"'
[ -f output/adapter_model.safetensors ] || fail "no adapter written to output"

# --- fsdp_qlora's full fine-tune -----------------------------------------------------------------
full=(--gradient_accumulation_steps 4 --batch_size 8 --context_length 512 --precision bf16
      --train_type full --use_gradient_checkpointing true --use_cpu_offload false
      --use_activation_cpu_offload false)
line full --world_size 2 --master_port 12356 --model_name Llama-2-7b-hf "${full[@]}" --log_to wandb --dataset alpaca
refused full "--world_size: fsdpd runs one worker per GPU on every node SLURM gives the job (or on this machine): drop it"
line full --master_port 12356 --model_name Llama-2-7b-hf "${full[@]}" --log_to wandb --dataset alpaca64.jsonl
refused full "--master_port: fsdpd's nodes find each other through SLURM (PMIx or its rendezvous file) and choose their ports: drop it"
line full --model_name Llama-2-7b-hf "${full[@]}" --log_to wandb --dataset alpaca64.jsonl
refused full "--log_to: runtime.log_to[0]: 'wandb' is not built yet: compute nodes usually have no network. Log to tensorboard and upload its event files from a machine that has: wandb sync --sync-tensorboard OUTPUT_DIR/tensorboard"
rm -rf output output.checkpoints
line full --model_name Llama-2-7b-hf "${full[@]}" --log_to tensorboard --dataset alpaca64.jsonl
trained full
ls output/tensorboard/events.out.tfevents.* > /dev/null || fail "--log_to tensorboard wrote no event file"
resolved $j runtime.log_to '["tensorboard"]' 
resolved $j train.type '"full"'
resolved $j train.global_batch 64 # 8 x 4 x 2 ranks
resolved $j train.accumulation 4
resolved $j data.seq_len 512
resolved $j fsdp.cpu_offload false
resolved $j fsdp.activation_checkpointing '"full"'
[ -f output/model.safetensors ] || fail "no model written to output"

# --- fsdp_qlora against TRL (booleans written True) ---------------------------------------------
line guanaco --train_type qlora --dataset guanaco --batch_size 8 --lr_scheduler cosine \
    --log_to wandb --save_model True --output_dir guanaco_7B --gradient_accumulation_steps 2 --lr 2e-4 \
    --model_name Llama-2-7b-hf
refused guanaco "--dataset: 'guanaco' is a data set name of fsdp_qlora's"
line guanaco --train_type qlora --dataset guanaco.jsonl --batch_size 8 --lr_scheduler cosine \
    --log_to wandb --save_model True --output_dir guanaco_7B --gradient_accumulation_steps 2 --lr 2e-4 \
    --model_name Llama-2-7b-hf
refused guanaco "'wandb' is not built yet: compute nodes usually have no network"
line guanaco --train_type qlora --dataset guanaco.jsonl --batch_size 8 --lr_scheduler cosine \
    --log_to stdout --save_model True --output_dir guanaco_7B --gradient_accumulation_steps 2 --lr 2e-4 \
    --model_name Llama-2-7b-hf
trained guanaco
j=guanaco_7B/job.json
resolved $j train.schedule '"cosine"'
resolved $j train.warmup_ratio 0.1
resolved $j train.warmup_round '"down"'
resolved $j train.min_lr 2e-5
resolved $j train.lr 2e-4
resolved $j train.global_batch 32
resolved $j output.consolidate true
resolved $j data.format '"text"'
resolved $j checkpoint.dir '"guanaco_7B.checkpoints"' # --output_dir places the checkpoints too
[ -d guanaco_7B.checkpoints ] && [ -f guanaco_7B/adapter_model.safetensors ] || fail "guanaco_7B's files"

# --- the Hugging Face blog: TRL's SFT through Accelerate ----------------------------------------
blog=(--max_seq_len 2048 --max_steps 500 --logging_steps 25 --eval_steps 100 --save_steps 250
      --bf16 True --packing True --output_dir "$tmp/shared_storage/experiments/full-finetune-llama-chat-asst"
      --per_device_train_batch_size 1 --gradient_accumulation_steps 1 --dataset_text_field "content"
      --use_gradient_checkpointing True --learning_rate 5e-5 --lr_scheduler_type "cosine"
      --weight_decay 0.01 --warmup_ratio 0.03 --use_flash_attn True)
line blog --model_name "meta-llama/Llama-2-70b-chat-hf" --dataset_name "smangrul/code-chat-assistant-v1" "${blog[@]}"
refused blog "--model_name: 'meta-llama/Llama-2-70b-chat-hf' looks like a Hugging Face hub id"
line blog --model_name Llama-2-7b-hf --dataset_name "smangrul/code-chat-assistant-v1" "${blog[@]}"
refused blog "--dataset_name: 'smangrul/code-chat-assistant-v1' looks like a Hugging Face hub id and is no file here"
line blog --model_name Llama-2-7b-hf --dataset_name content.jsonl "${blog[@]}"
refused blog "train.eval_interval: 100 is set but data.eval_fraction is 0: no data is held out to evaluate (set data.eval_fraction, e.g. 0.05)"
# 500 steps on the CPU take too long: a few, then SIGTERM (a checkpoint, exit 1)
"$fsdpd" --model_name Llama-2-7b-hf --dataset_name content.jsonl "${blog[@]}" --data.eval_fraction 0.2 > blog.log 2>&1 &
pid=$!
bg_pids+=("$pid")
metrics=$tmp/shared_storage/experiments/full-finetune-llama-chat-asst/metrics.jsonl
step3_or_exit() { grep -qs '"step":3,' "$metrics" || ! kill -0 "$pid" 2>/dev/null; } # step lines: every 25
wait_for 240 step3_or_exit
kill -0 "$pid" 2>/dev/null || { cat blog.log; fail "blog: the job ended before step 3"; }
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[ "$status" -eq 1 ] && grep -q "stopped by signal SIGTERM" blog.log || { cat blog.log; fail "blog: no clean stop"; }
grep -q "note: defaults: trainer's" blog.log || fail "blog: the Trainer's defaults are not said"
grep -q "note: --use_flash_attn True: fsdpd's attention is always its fused" blog.log || fail "blog: --use_flash_attn"
grep -q "data.format auto: text (its first record has content)" blog.log || fail "blog: the content field"
j=$tmp/shared_storage/experiments/full-finetune-llama-chat-asst/job.json
resolved $j train.defaults '"trainer"'
resolved $j train.max_steps 500
resolved $j runtime.log_every 25
resolved $j train.eval_interval 100
resolved $j checkpoint.interval_steps 250
resolved $j data.packing true
resolved $j data.text_field '"content"'
resolved $j data.seq_len 2048
resolved $j train.global_batch 2
resolved $j train.schedule '"cosine"'
resolved $j train.warmup_ratio 0.03
resolved $j train.warmup_round '"up"'
resolved $j train.weight_decay 0.01
resolved $j train.lr 5e-5
resolved $j train.clip_norm 1.0 # the Trainer's max_grad_norm default
# ceil(0.03 x 500) = 15 warm-up steps: step 3's lr is 5e-5 x 2/15
python3 -c '
import json, sys
lr = [m["lr"] for m in map(json.loads, open(sys.argv[1])) if m.get("step") == 3]
if len(lr) != 1 or abs(lr[0] - 5e-5 * 2 / 15) > 1e-12: sys.exit("step 3 lr %r" % lr)' \
    "$metrics" || fail "the blog's warm-up"
echo ok
