"""Loads fsdpd's consolidated models with Hugging Face transformers and checks them against
`fsdpctl reference` (tests/interop/README.md says how the cases are made and run).

For each case directory (made by make_cases.sh):
  f32/   consolidated in f32: loaded with AutoModelForCausalLM.from_pretrained(dtype=float32,
         attn_implementation="eager"); every weight must come from the files (no missing,
         unexpected or mismatched keys); its logits and loss on batch.safetensors must match
         reference.safetensors (fsdpctl reference on the same directory) to a relative error
         ||a - b|| / ||b|| <= 1e-5;
  bf16/  fsdpd's own output.dir (bf16): loaded in bfloat16, every parameter must equal the f32
         one rounded to bf16;
  the class transformers builds is config.json's architectures[0] (F43: Qwen2ForCausalLM,
         Qwen3ForCausalLM, MistralForCausalLM as well as LlamaForCausalLM);
  bnb4/  (qwen2) fsdpctl quantize's bnb-4bit directory (fp32 compute dtype): loaded with
         bitsandbytes, its logits against reference_nf4.safetensors (fsdpctl reference --quant
         nf4 on f32/, the same NF4 round trip) to 1e-3; skipped, said so, when bitsandbytes
         does not import.
Prints one line per check and exits 1 if any fails.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

RTOL = 1e-5


def rel_error(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def load(path, dtype, device):
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager", output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(kind):
            raise AssertionError(f"{path}: {kind}: {sorted(info[kind])[:4]}")
    return model.to(device).eval()


def check_case(case, device):
    ok = True
    batch = load_file(os.path.join(case, "batch.safetensors"))
    ref = load_file(os.path.join(case, "reference.safetensors"))
    ids = batch["input_ids"].long().to(device)
    labels = batch["labels"].long().to(device)

    model = load(os.path.join(case, "f32"), torch.float32, device)
    arch = json.load(open(os.path.join(case, "f32", "config.json")))["architectures"][0]
    good = type(model).__name__ == arch
    ok &= good
    print(f"{case}: loaded as {type(model).__name__} (config.json: {arch}): {'ok' if good else 'FAIL'}")
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    logits = out.logits.float().cpu()
    err = rel_error(logits, ref["logits"])
    loss_err = abs(out.loss.item() - ref["loss"].item()) / abs(ref["loss"].item())
    good = err <= RTOL and loss_err <= RTOL
    ok &= good
    print(f"{case}: f32 logits {list(logits.shape)} rel {err:.3e}, loss {out.loss.item():.6f} vs "
          f"{ref['loss'].item():.6f} rel {loss_err:.3e} (<= {RTOL:g}): {'ok' if good else 'FAIL'}")

    f32_params = {k: v.detach() for k, v in model.named_parameters()}
    bf16 = load(os.path.join(case, "bf16"), torch.bfloat16, device)
    bad = [k for k, v in bf16.named_parameters() if not torch.equal(v, f32_params[k].to(torch.bfloat16))]
    good = not bad and len(f32_params) == len(dict(bf16.named_parameters()))
    ok &= good
    print(f"{case}: bf16 {len(f32_params)} parameters == f32 rounded to bf16: "
          f"{'ok' if good else 'FAIL ' + ', '.join(bad[:3])}")
    if os.path.isdir(os.path.join(case, "bnb4")):
        ok &= check_bnb4(case, ids, device)
    return ok


def check_bnb4(case, ids, device):
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        print(f"{case}: bnb4 skipped: bitsandbytes does not import")
        return True
    model = load(os.path.join(case, "bnb4"), torch.float32, device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float().cpu()
    err = rel_error(logits, load_file(os.path.join(case, "reference_nf4.safetensors"))["logits"])
    good = err <= 1e-3
    print(f"{case}: bnb4 loaded as {type(model).__name__}, logits rel {err:.3e} vs fsdpctl reference "
          f"--quant nf4 (<= 1e-3): {'ok' if good else 'FAIL'}")
    return good


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", help="case directories made by make_cases.sh")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    # Plain fp32 products on the GPU: TF32 would cost three decimal digits.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    ok = True
    for case in args.cases:
        try:
            ok &= check_case(case.rstrip("/"), args.device)
        except Exception as e:  # a case that does not load is a failed case, the rest still run
            print(f"{case}: FAIL: {type(e).__name__}: {e}")
            ok = False
    print("interop: all ok" if ok else "interop: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
