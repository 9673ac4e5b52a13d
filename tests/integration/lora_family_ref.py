"""LoRA references for the families without a PEFT golden (test_reference_lora.sh):

  make DIR OUT_ADAPTER OUT_MERGED   a PEFT adapter on every linear of the golden DIR (r 8,
      alpha 16, lora_A and lora_B random so the adapter moves the output) and the model with it
      merged in (W + scale B A, as merge_and_unload writes it: biases and norms unchanged);
  expect ADAPTER MERGED_OUT OUT     from fsdpctl reference's outputs of the merged model, what
      the adapter run must give: its logits and loss, and by the chain rule through
      W' = W + scale B A the adapter gradients grad.A = scale B^T grad.W', grad.B = scale
      grad.W' A^T (names as PEFT's in memory, with .default).
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

SCALE = 16 / 8
MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def adapter_name(layer, module, which):
    return f"base_model.model.model.layers.{layer}.{module}.lora_{which}.weight"


def make(golden, adapter_dir, merged_dir):
    base = load_file(os.path.join(golden, "model.safetensors"))
    layers = json.load(open(os.path.join(golden, "config.json")))["num_hidden_layers"]
    rng = np.random.default_rng(43)
    adapter, merged = {}, dict(base)
    for l in range(layers):
        for m in MODULES:
            w = base[f"model.layers.{l}.{m}.weight"]
            a = (rng.standard_normal((8, w.shape[1])) * 0.1).astype(np.float32)
            b = (rng.standard_normal((w.shape[0], 8)) * 0.05).astype(np.float32)
            adapter[adapter_name(l, m, "A")], adapter[adapter_name(l, m, "B")] = a, b
            merged[f"model.layers.{l}.{m}.weight"] = (w.astype(np.float64) + SCALE * (b.astype(np.float64) @ a)).astype(np.float32)
    os.makedirs(adapter_dir)
    save_file(adapter, os.path.join(adapter_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
    os.makedirs(merged_dir)
    save_file(merged, os.path.join(merged_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(golden, "config.json"), merged_dir)


def expect(adapter_dir, merged_out, out):
    adapter = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    ref = load_file(merged_out)
    want = {"logits": ref["logits"], "loss": ref["loss"]}
    for name, a in adapter.items():
        if ".lora_A." not in name:
            continue
        b = adapter[name.replace(".lora_A.", ".lora_B.")].astype(np.float64)
        base = name[len("base_model.model."):].replace(".lora_A.weight", ".weight")
        g = ref["grad." + base].astype(np.float64)
        for which, value in (("A", SCALE * b.T @ g), ("B", SCALE * g @ a.astype(np.float64).T)):
            key = "grad." + name.replace(".lora_A.", f".lora_{which}.").replace(".weight", ".default.weight")
            want[key] = value.astype(np.float32)
    save_file(want, out)


if __name__ == "__main__":
    {"make": make, "expect": expect}[sys.argv[1]](*sys.argv[2:])
