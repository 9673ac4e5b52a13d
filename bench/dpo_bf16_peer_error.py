"""How far PyTorch's own bf16 lands from the DPO/ORPO golden (F49), as bf16_peer_error.py does
for the model goldens (F43): each TRL case of tests/fixtures/dpo goes through TRL's trainer as
tests/golden_gen/dpo_trl.py builds it (the committed adapter init), the policy (and a full DPO's
reference copy) cast to bf16 on the GPU, one loss and backward; every gradient's relative error
||a - b|| / ||b|| against the golden is printed, the worst of each case last, so that a tensor
past DESIGN.md's 2e-2 in fsdpd's CUDA run (tests/integration/test_pref_golden.sh with
FSDP_GOLDEN_BACKEND=cuda) can be told apart: bf16 itself, or fsdpd.

    python3 bench/dpo_bf16_peer_error.py            (the device machine: torch, transformers, PEFT;
                                                     TRL from dev-carry/wheels as dpo_golden.py)

Without CUDA it runs on the CPU (bf16 there too: a check of the script, not the figure)."""
import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "golden_gen"))
import dpo_trl  # noqa: E402  (sets up the datasets stub and TRL's wheel before any HF import)
import dpo_golden as G  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b)) if np.linalg.norm(b) > 0 else float(np.linalg.norm(a))


def bf16_case(name, case, golden, init, tmp):
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # on the GPU the trainer's own device too (ORPO moves its batch to the accelerator's)
    trainer = dpo_trl.build_trainer(case, tmp, use_cpu=dev.type == "cpu")
    model = trainer.model
    if case["mode"] == "lora":
        dpo_trl.init_adapters(model, init)
    model.to(dev, torch.bfloat16).train()
    if getattr(trainer, "ref_model", None) is not None:
        trainer.ref_model.to(dev, torch.bfloat16)
    batch, _ = dpo_trl.trl_batch(trainer, case)
    batch = {k: (v.to(dev) if hasattr(v, "to") else v) for k, v in batch.items()}
    trainer.compute_loss(model, batch).backward()
    grads = {n[len(G.PEFT_PREFIX):] if n.startswith(G.PEFT_PREFIX) else n: p.grad.float().cpu().numpy()
             for n, p in model.named_parameters() if p.requires_grad}
    prefix = name + ".grad."
    errors = {k[len(prefix):]: rel(grads[k[len(prefix):]], v) for k, v in golden.items() if k.startswith(prefix)}
    if not errors:
        raise RuntimeError(f"{name}: no gradient of the golden found in the model")
    for k, e in sorted(errors.items()):
        print(f"{name:18s} {k:70s} rel {e:.3e}")
    worst = max(errors, key=errors.get)
    print(f"{name:18s} worst {errors[worst]:.3e} ({worst}), {len(errors)} gradients, bf16 on {dev.type}")
    return errors[worst]


def main():
    import torch
    from safetensors.numpy import load_file

    dpo_trl.import_trl()
    torch.manual_seed(0)
    golden = load_file(os.path.join(REPO, "tests", "fixtures", "dpo", "dpo_golden.safetensors"))
    init = {k[len("lora_init."):]: v for k, v in golden.items() if k.startswith("lora_init.")}
    worst = {}
    with tempfile.TemporaryDirectory(prefix="dpo-bf16-") as tmp:
        for name, case in G.CASES:
            if not case.get("formula_only"):
                worst[name] = bf16_case(name, case, golden, init, os.path.join(tmp, name))
    print("PyTorch bf16 against the golden, worst gradient a case: " +
          ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
