# The PyTorch FSDP2 peer of fsdpd's multi-GPU figures (F15): transformers' LlamaForCausalLM
# (or, F43, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM) sharded with fully_shard (one unit per decoder layer, the rest in the root), bf16
# parameters for compute and fp32 gradient reduction (MixedPrecisionPolicy), fp32 master
# weights and AdamW state, activation checkpointing, SDPA attention: the precision and
# sharding fsdpd uses.  Each rank trains on its own random batch of --batch sequences.
#
#   torchrun --standalone --nproc_per_node=N bench/peer_fsdp.py --model llama2-7b --batch 4 --seq 2048
#
# --model: llama-1.1b, llama2-7b, llama2-13b, llama3-8b (the shapes and RoPE of
# configs/models/llama3.1-8b.json), qwen2.5-7b, qwen3-8b, mistral-7b-v0.3 (those of
# configs/models/qwen2.5-7b.json, qwen3-8b.json, mistral-7b-v0.3.json: Qwen2's q/k/v biases,
# Qwen3's q/k norms); tie_word_embeddings false everywhere.
#
# --float8 (F45): torchao's float8 training on the decoder layers' linears but the first and
# the last layer's (fsdpd's train.precision fp8 layers), tensorwise dynamic scaling, the FP8
# all-gather of weights (enable_fsdp_float8_all_gather, the scales precomputed after each
# optimizer step, as torchtitan does); --compile: each decoder layer under torch.compile (torchao
# fuses its casts there; eager, each cast is its own kernels).
#
# Rank 0 prints one JSON line: step time, tokens/s in all and per GPU, MFU (the formula of
# ../shared/bench/peer_torch.py), peak memory of rank 0 (max_memory_allocated).
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
import transformers
from transformers import LlamaConfig

CFG = {  # the shapes of configs/models/*.json
    "llama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                       num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "llama2-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=40, vocab_size=32000),
    # llama3.1-8b.json: GQA (8 KV heads), 128256 tokens, RoPE theta 500000 with llama3 scaling
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=131072,
                      rope=dict(rope_theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # F43: the other families, as configs/models/ has them (sliding windows off, as released)
    "qwen2.5-7b": dict(family="Qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6,
                       rope=dict(rope_theta=1000000.0, rope_type="default")),
    "qwen3-8b": dict(family="Qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     rms_norm_eps=1e-6, rope=dict(rope_theta=1000000.0, rope_type="default")),
    "mistral-7b-v0.3": dict(family="Mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32768,
                            sliding_window=None, rope=dict(rope_theta=1000000.0, rope_type="default")),
}


def classes(family):
    """transformers' config and model classes of a family ("Llama", "Qwen2", ...)."""
    return getattr(transformers, family + "Config"), getattr(transformers, family + "ForCausalLM")


def rope_kwargs(rope):
    """RoPE settings in this transformers' spelling: rope_parameters (5.x) or rope_theta and
    rope_scaling (4.x); none: its default (theta 10000, no scaling)."""
    if rope is None:
        return {}
    if hasattr(LlamaConfig(), "rope_parameters"):
        return dict(rope_parameters=dict(rope))
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return dict(rope_theta=rope["rope_theta"], rope_scaling=scaling)


def built_rope_type(model, cfg):
    """The RoPE the model was built with: its rotary embedding's, else its config's."""
    emb = getattr(model.model, "rotary_emb", None)
    if hasattr(emb, "rope_type"):
        return emb.rope_type
    for attr in ("rope_parameters", "rope_scaling"):
        r = getattr(cfg, attr, None)
        if isinstance(r, dict) and "rope_type" in r:
            return r["rope_type"]
    return "default"


def to_float8(model, n_layers):
    """torchao's float8 linears in decoder layers 1 .. n_layers - 2 (the head and the first and
    last layers stay bf16, as fsdpd's train.precision fp8 keeps them)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def chosen(mod, fqn):
        parts = fqn.split(".")
        if not isinstance(mod, torch.nn.Linear) or "layers" not in parts:
            return False
        layer = int(parts[parts.index("layers") + 1])
        return 1 <= layer <= n_layers - 2

    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True),
                               module_filter_fn=chosen)
    return sum(isinstance(m, torch.nn.Linear) and type(m).__name__ == "Float8Linear" for m in model.modules())


def build(name, seq, ckpt, float8=False, compile_layers=False):
    shape = dict(CFG[name])
    rope = shape.pop("rope", None)
    config_class, model_class = classes(shape.pop("family", "Llama"))
    shape.setdefault("max_position_embeddings", seq)
    cfg = config_class(**shape, **rope_kwargs(rope), attn_implementation="sdpa", use_cache=False,
                       tie_word_embeddings=False)
    with torch.device("cuda"):
        model = model_class(cfg)  # fp32, initialised on the GPU, then sharded
    n_total = sum(p.numel() for p in model.parameters())
    rope_type = built_rope_type(model, cfg)
    if rope_type != (rope or {}).get("rope_type", "default"):  # a spelling this transformers ignored
        raise SystemExit(f"{name}: transformers built RoPE '{rope_type}', not {rope}")
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_float8 = to_float8(model, cfg.num_hidden_layers) if float8 else 0
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if compile_layers:
            layer.compile()
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return cfg, model, n_total, n_float8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama2-7b", choices=sorted(CFG))
    ap.add_argument("--batch", type=int, default=4, help="sequences per GPU")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--no-ckpt", action="store_true", help="no activation checkpointing")
    ap.add_argument("--float8", action="store_true", help="torchao float8 training (tensorwise, FP8 all-gather)")
    ap.add_argument("--compile", action="store_true", help="each decoder layer under torch.compile")
    a = ap.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg, model, n_total, n_float8 = build(a.model, a.seq, not a.no_ckpt, a.float8, a.compile)
    if a.float8:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
    opt_kind = "fused"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")

    def step():
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.float8:  # the weights' scales for the next step's FP8 all-gather
            precompute_float8_dynamic_scale_for_fsdp(model)
        return loss

    try:
        step()
    except RuntimeError:  # fused AdamW over DTensors missing in this torch: the foreach one
        opt_kind = "foreach"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(a.warm - 1):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.time()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.time() - t0) / a.steps
    tok = world * a.batch * a.seq / dt
    L, d = cfg.num_hidden_layers, cfg.hidden_size
    flops_tok = 6 * (n_total - cfg.vocab_size * d) + 12 * L * d * a.seq
    if rank == 0:
        print(json.dumps(dict(peer="torch fully_shard", model=a.model, model_class=type(model).__name__, gpus=world, batch_per_gpu=a.batch,
                              seq=a.seq, activation_checkpointing=not a.no_ckpt, optimizer=opt_kind,
                              float8_linears=n_float8, compiled=a.compile, params_b=n_total / 1e9, step_s=dt,
                              tokens_per_s=tok, tokens_per_s_per_gpu=tok / world,
                              mfu=flops_tok * tok / world / 989e12,
                              peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
                              loss=loss.item())), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
