# Peer for QLoRA on one GPU: transformers LlamaForCausalLM (random init) with every decoder linear replaced by
# bitsandbytes Linear4bit (NF4, double quant, bf16 compute), PEFT LoRA on every linear, gradient checkpointing,
# SDPA, AdamW on the adapters. usage: python3 peer_qlora.py [--model llama2-7b] [--batch 4] [--seq 2048] [--rank 64]
# Copied from ../shared/bench/peer_qlora.py (read-only there) for F43: --model qwen2.5-7b, qwen3-8b and
# mistral-7b-v0.3 build Qwen2ForCausalLM (q/k/v biases kept, unquantized, in Linear4bit's bias), Qwen3ForCausalLM
# and MistralForCausalLM at the shapes of configs/models/.
import argparse, json, time, torch, bitsandbytes as bnb, transformers
from peft import LoraConfig, get_peft_model
CFG = {"llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
       "llama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
       "qwen2.5-7b": dict(family="Qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                          num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6, rope_theta=1000000.0),
       "qwen3-8b": dict(family="Qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=128, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0),
       "mistral-7b-v0.3": dict(family="Mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=32768, sliding_window=None, rope_theta=1000000.0)}
ap = argparse.ArgumentParser(); ap.add_argument("--model", default="llama2-7b"); ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=2048); ap.add_argument("--rank", type=int, default=64); ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--no-ckpt", action="store_true", help="without gradient checkpointing (PEFT's fastest setting, where it fits)")
a = ap.parse_args()
shape = dict(CFG[a.model]); family = shape.pop("family", "Llama"); theta = shape.pop("rope_theta", None)
Config, Model = getattr(transformers, family + "Config"), getattr(transformers, family + "ForCausalLM")
if theta is not None:  # transformers 5 spells it rope_parameters, 4.x rope_theta
    shape.update(rope_parameters=dict(rope_type="default", rope_theta=theta) if hasattr(Config(), "rope_parameters") else dict(rope_theta=theta))
cfg = Config(**shape, max_position_embeddings=a.seq, attn_implementation="sdpa", use_cache=False, tie_word_embeddings=False)
with torch.device("cuda"):
    model = Model(cfg).to(torch.bfloat16)
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
for layer in model.model.layers:
    for parent in (layer.self_attn, layer.mlp):
        for n in targets:
            lin = getattr(parent, n, None)
            if lin is None: continue
            q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None, compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4")
            q.weight = bnb.nn.Params4bit(lin.weight.data.to("cpu"), requires_grad=False, compress_statistics=True, quant_type="nf4").to("cuda")
            if lin.bias is not None: q.bias = torch.nn.Parameter(lin.bias.data.clone(), requires_grad=False)  # Qwen2's q/k/v
            setattr(parent, n, q); del lin
torch.cuda.empty_cache()
for p in model.parameters(): p.requires_grad_(False)
if not a.no_ckpt: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=16, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
torch.cuda.reset_peak_memory_stats()
ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")
times = []
for s in range(a.steps):
    torch.cuda.synchronize(); t = time.time()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); times.append(time.time() - t)
st = sum(times[3:]) / len(times[3:])
print(json.dumps({"peer": "transformers+peft+bitsandbytes qlora", "model": a.model, "model_class": Model.__name__, "rank": a.rank, "batch": a.batch, "seq": a.seq, "ckpt": not a.no_ckpt,
                  "step_s": st, "tokens_per_s": a.batch * a.seq / st, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                  "loss": float(loss), "bnb": bnb.__version__}), flush=True)
