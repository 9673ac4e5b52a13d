# Peer for QLoRA on one GPU: transformers LlamaForCausalLM (random init) with every decoder linear replaced by
# bitsandbytes Linear4bit (NF4, double quant, bf16 compute), PEFT LoRA on every linear, gradient checkpointing,
# SDPA, AdamW on the adapters. usage: python3 peer_qlora_long.py [--model llama3.1-8b] [--batch 1] [--seq 32768] [--rank 64]
# Copied from ../shared/bench/peer_qlora.py (read-only there) for F46's bench/long_context.sh: it adds
# --model llama3.1-8b (configs/models/llama3.1-8b.json's shape, rope theta 500000), counts
# --steps 1 (the step's own time: a long step is minutes), and says an out-of-memory step as JSON
# ({"oom": true, ...}) instead of a traceback.
import argparse, json, time, torch, bitsandbytes as bnb
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model
CFG = {"llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
       "llama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
       "llama3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                           rope_theta=500000.0, rms_norm_eps=1e-5)}
ap = argparse.ArgumentParser(); ap.add_argument("--model", default="llama2-7b"); ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=2048); ap.add_argument("--rank", type=int, default=64); ap.add_argument("--steps", type=int, default=8)
a = ap.parse_args()
shape = dict(CFG[a.model]); theta = shape.pop("rope_theta", None)
if theta is not None:  # transformers 5 spells it rope_parameters, 4.x rope_theta
    shape.update(rope_parameters=dict(rope_type="default", rope_theta=theta) if hasattr(LlamaConfig(), "rope_parameters") else dict(rope_theta=theta))
cfg = LlamaConfig(**shape, max_position_embeddings=a.seq, attn_implementation="sdpa", use_cache=False, tie_word_embeddings=False)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
for layer in model.model.layers:
    for parent in (layer.self_attn, layer.mlp):
        for n in targets:
            lin = getattr(parent, n, None)
            if lin is None: continue
            q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4")
            q.weight = bnb.nn.Params4bit(lin.weight.data.to("cpu"), requires_grad=False, compress_statistics=True, quant_type="nf4").to("cuda")
            setattr(parent, n, q); del lin
torch.cuda.empty_cache()
for p in model.parameters(): p.requires_grad_(False)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}); model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=16, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
torch.cuda.reset_peak_memory_stats()
ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")
times = []
try:
    for s in range(a.steps):
        torch.cuda.synchronize(); t = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.time() - t)
except torch.cuda.OutOfMemoryError:
    print(json.dumps({"peer": "transformers+peft+bitsandbytes qlora", "model": a.model, "seq": a.seq, "oom": True,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
    raise SystemExit(0)
st = sum(times[3:]) / len(times[3:]) if len(times) > 3 else times[-1]
print(json.dumps({"peer": "transformers+peft+bitsandbytes qlora", "model": a.model, "rank": a.rank, "batch": a.batch, "seq": a.seq,
                  "step_s": st, "tokens_per_s": a.batch * a.seq / st, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                  "loss": float(loss), "bnb": bnb.__version__, "oom": False}), flush=True)
