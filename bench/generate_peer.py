"""The peer of bench/generate_bench.sh: transformers' generate (greedy, bf16, on CUDA) on the
model directory fsdpctl generate reads, the same prompts, the same number of new tokens
(min_new_tokens: no early EOS), timed after a warm-up; prints one JSON line: tokens/s, seconds,
the new ids.

    python3 bench/generate_peer.py MODEL_DIR PROMPTS.json NEW_TOKENS
PROMPTS.json: a list of prompts, each a list of ids, all of one length (no padding needed)."""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

model_dir, prompts_path, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
except TypeError:  # transformers before 4.56 spells it torch_dtype
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
model = model.cuda().eval()
prompts = json.load(open(prompts_path))
ids = torch.tensor(prompts, device="cuda")
mask = torch.ones_like(ids)
kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
with torch.no_grad():
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
print(json.dumps({"tokens_per_s": len(prompts) * new / sec, "seconds": sec,
                  "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                  "ids": out[:, ids.shape[1]:].tolist()}))
