"""How far PyTorch's own bf16 lands from the float64 goldens (F43): for each golden model dir,
transformers loads it, casts it to bf16 and computes the loss and every gradient on the golden
batch on the GPU; each gradient's relative error ||a - b|| / ||b|| against expected.safetensors
is printed beside fsdpd's (from `fsdpctl compare` logs, when given), so that a tensor past
DESIGN.md's 2e-2 can be told apart: bf16 itself, or fsdpd.

    python3 bench/bf16_peer_error.py GOLDEN_DIR... [--compare NAME=COMPARE.txt ...]

Needs torch (CUDA), transformers and safetensors (the device machine has them)."""
import re
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm()) if float(b.norm()) > 0 else float(a.norm())


def fsdpd_errors(path):
    errors = {}
    for line in open(path):
        m = re.match(r"(grad\.\S+)\s+\[.*\]\s+rel\s+([0-9.e+-]+)", line)
        if m:
            errors[m.group(1)] = float(m.group(2))
    return errors


def main(argv):
    dirs = [a for a in argv if not a.startswith("--") and "=" not in a]
    compares = dict(a.split("=", 1) for a in argv if "=" in a)
    for d in dirs:
        name = d.rstrip("/").split("/")[-1]
        batch, want = load_file(f"{d}/batch.safetensors"), load_file(f"{d}/expected.safetensors")
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to("cuda", torch.bfloat16)
        ids, labels = batch["input_ids"].long().cuda(), batch["labels"].long().cuda()
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        ours = fsdpd_errors(compares[name]) if name in compares else {}
        rows = []
        for pname, p in model.named_parameters():
            key = f"grad.{pname}"
            if key in want and p.grad is not None:
                rows.append((rel(p.grad.float().cpu(), want[key]), key))
        rows.sort(reverse=True)
        print(f"{name}: loss bf16 {out.loss.item():.6f} vs {want['loss'].item():.6f}; "
              f"logits rel {rel(out.logits.float().cpu(), want['logits']):.3e}")
        for e, key in rows[:6]:
            theirs = f"  fsdpd {ours[key]:.3e}" if key in ours else ""
            print(f"  {key:60s} torch bf16 {e:.3e}{theirs}")
        print(f"{name}: {sum(e > 2e-2 for e, _ in rows)} of {len(rows)} torch bf16 gradients past 2e-2")


if __name__ == "__main__":
    main(sys.argv[1:])
