#!/usr/bin/env python3
"""The peer of bench/dpo_bench.sh: TRL's DPOTrainer + PEFT on one GPU (F49).

  peer_dpo.py --write-pairs FILE --pairs N --prompt P --completion C --vocab V
      numpy + safetensors only: N random pairs (seed 0) as rows 2i (prompt + chosen) and 2i+1
      (prompt + rejected), input_ids and labels int32 [2N, P + C], labels -100 on the prompt;
      ids in [3, V), every completion's last id the EOS (2), so TRL adds none.  fsdpd reads it
      through fsdpctl tokenize --from-safetensors --pairs, this peer as below.
  peer_dpo.py --data FILE --pairs N --steps S --warm W --peer-torch PEER_TORCH [--vocab V]
      Llama-2-7B as ../shared/bench/peer_torch.py builds it (its CFG["llama2-7b"], SDPA
      attention, random init on the GPU, then bf16), LoRA r 64, alpha 16, dropout 0 on q, k, v,
      o, gate, up, down (PEFT through DPOTrainer's peft_config, so the reference is the base with
      the adapters off), DPOConfig bf16, gradient checkpointing (non-reentrant),
      precompute_ref_log_probs False, sigmoid loss, beta 0.1, lr 1e-5 constant, fused AdamW, N
      pairs a step; trainer.train() for W + S steps, each step timed between the callbacks'
      step begin and end (CUDA synchronized).  Prints one JSON line: tokens a step (TRL's own
      count, the attention mask's sum: prompt + completion of both rows), the mean step time of
      the S steps after the first W, tokens/s, the peak of torch.cuda.max_memory_allocated (reset
      once the bf16 model is built), the last loss.
TRL is the installed one or the carried wheel (dev-carry/wheels); `datasets` is the stub of
tests/golden_gen/datasets_stub (the GPU machine has none; TRL imports it at load: the peer
calls only its Dataset's from_list, map, filter, len and indexing).  The tokenizer is the
golden's id-level one (tests/golden_gen/dpo_trl.py): tokens "<id>", split on whitespace.
"""

import argparse
import ast
import json
import os
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOS = 2
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_pairs(path, pairs, prompt, completion, vocab):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    seq = prompt + completion
    ids = np.empty((2 * pairs, seq), dtype=np.int32)
    for i in range(pairs):
        p = rng.integers(3, vocab, prompt)
        for side in range(2):
            c = rng.integers(3, vocab, completion)
            c[-1] = EOS
            ids[2 * i + side] = np.concatenate([p, c])
    labels = ids.copy()
    labels[:, :prompt] = -100
    save_file({"input_ids": ids, "labels": labels}, path)
    print(f"{path}: {pairs} pairs of {prompt} + {completion} tokens")


def read_rows(path):
    """The pairs file as TRL's preference records over the id-level tokens."""
    from safetensors.numpy import load_file
    import dpo_trl

    t = load_file(path)
    ids, labels = t["input_ids"], t["labels"]
    rows = []
    for i in range(0, ids.shape[0], 2):
        n = int(np.argmax(labels[i] != -100))
        if not np.array_equal(ids[i, :n], ids[i + 1, :n]):
            sys.exit(f"{path}: rows {i} and {i + 1} do not share a prompt")
        rows.append({"prompt": dpo_trl.tokens(ids[i, :n]), "chosen": " " + dpo_trl.tokens(ids[i, n:]),
                     "rejected": " " + dpo_trl.tokens(ids[i + 1, n:])})
    return rows, ids.shape[1]


def peer_cfg(peer_torch):
    """CFG of peer_torch.py (its model shapes), read without running its GPU measurements."""
    with open(peer_torch) as f:
        tree = ast.parse(f.read(), peer_torch)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CFG" for t in node.targets):
            return eval(compile(ast.Expression(node.value), peer_torch, "eval"), {"dict": dict})
    sys.exit(f"{peer_torch}: no CFG")


def run_peer(args):
    sys.path.insert(0, os.path.join(REPO, "tests", "golden_gen"))
    import dpo_trl

    trl = dpo_trl.import_trl()
    import torch
    from peft import LoraConfig
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback
    from trl import DPOConfig, DPOTrainer
    from datasets import Dataset

    rows, seq = read_rows(args.data)
    if len(rows) < args.pairs * (args.warm + args.steps):
        sys.exit(f"{args.data}: {len(rows)} pairs, {args.pairs * (args.warm + args.steps)} needed")
    cfg = LlamaConfig(**peer_cfg(args.peer_torch)[args.model], max_position_embeddings=seq,
                      attn_implementation="sdpa", use_cache=False)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, *_a, **_k):
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *_a, **_k):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t0)

    timer = Timer()
    steps = args.warm + args.steps
    with tempfile.TemporaryDirectory(prefix="peer-dpo-") as tmp:
        config = DPOConfig(output_dir=tmp, per_device_train_batch_size=args.pairs, max_length=seq, bf16=True,
                           gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
                           precompute_ref_log_probs=False, beta=0.1, loss_type=["sigmoid"], learning_rate=1e-5,
                           lr_scheduler_type="constant", optim="adamw_torch_fused", max_steps=steps,
                           logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
                           dataloader_num_workers=0)
        lora = LoraConfig(r=64, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
        trainer = DPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows[: args.pairs * steps]),
                             processing_class=dpo_trl.make_tokenizer(args.vocab), peft_config=lora,
                             callbacks=[timer])
        trainer.train()
    timed = timer.times[args.warm:]
    step_s = sum(timed) / len(timed)
    tokens_a_step = trainer._total_train_tokens // steps
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(json.dumps(dict(peer="trl-dpo", trl=trl.__version__, model=args.model, pairs=args.pairs, seq=seq,
                          tokens_a_step=tokens_a_step, step_s=step_s, tokens_per_s=tokens_a_step / step_s,
                          timed_steps=len(timed), peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
                          loss=float(losses[-1]))), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-pairs", metavar="FILE")
    ap.add_argument("--data", metavar="FILE")
    ap.add_argument("--pairs", type=int, required=True)
    ap.add_argument("--prompt", type=int)
    ap.add_argument("--completion", type=int)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--peer-torch", default=os.path.join(REPO, "dev-carry", "peer_torch.py"))
    ap.add_argument("--model", default="llama2-7b")
    args = ap.parse_args()
    if args.write_pairs:
        if not args.prompt or not args.completion:
            ap.error("--write-pairs needs --prompt and --completion")
        write_pairs(args.write_pairs, args.pairs, args.prompt, args.completion, args.vocab)
    elif args.data:
        run_peer(args)
    else:
        ap.error("--write-pairs or --data")


if __name__ == "__main__":
    main()
