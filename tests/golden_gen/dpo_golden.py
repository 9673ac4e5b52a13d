#!/usr/bin/env python3
"""Generator of tests/fixtures/dpo/dpo_golden.{json,safetensors} (F49, issue 60).

On the GPU machine's CPU (torch 2.11, transformers 5.17, PEFT 0.21, TRL 1.16.0 from the carried
wheel, `datasets` replaced by the stub in datasets_stub/), 1 thread, fp32, over
tests/fixtures/golden/tiny-mha, four preference pairs (one a multi-turn conversation) go through
TRL's own pipeline: the DPO cases through DPOTrainer (its dataset preparation with an id-level
tokenizer and chat template, DataCollatorForPreference, compute_loss with the fused LM head, the
reference = adapters off for LoRA, a frozen copy for full), the ORPO cases through
trl.experimental.orpo.ORPOTrainer (tokenize_row, DPODataCollatorWithPadding, compute_loss). Every
case also goes through the float64 formula path of dpo_formula.py (numpy), which is the only
source of the cases TRL 1.16 has no loss type for (cdpo). Then one torch AdamW step on the
trainable parameters and the same batch again (`step2`).

  python3 tests/golden_gen/dpo_golden.py --out DIR          # the whole golden (needs torch+TRL)
  python3 tests/golden_gen/dpo_golden.py --lora-init tests/fixtures/dpo/dpo_golden.safetensors --out DIR
      # the same, the adapters starting at the committed golden's init (the seeded draw of
      # this script is not the one the committed golden was made with: its generator was lost)
  python3 tests/golden_gen/dpo_golden.py --formula-only --lora-init FILE --out DIR
      # numpy only: the formula figures, the batch and the formula-only cases' gradients, with
      # the adapter init read from FILE (an earlier golden's lora_init.*), for checking here.

Compare two outputs with compare_dpo_golden.py. README.md beside this file says more.
"""

import argparse
import json
import os
import platform
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import dpo_formula as F  # noqa: E402

MODEL_DIR = os.path.join(REPO, "tests", "fixtures", "golden", "tiny-mha")
MAX_LENGTH = 28
TRUNCATION = "keep_start"
PAD, BOS, EOS = 0, 1, 2
ROLES = {"user": 3, "assistant": 4, "system": 6}
TEMPLATE = (
    "id-level: BOS, per message ROLE content EOS, generation prompt = assistant role id; roles "
    + json.dumps(ROLES)
)
LORA = {
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "v_proj"],
    "scale": 2.0,
    "init": "A 0.1 N(0,1), B 0.05 N(0,1), torch.Generator seed 1234, in sorted name order (A before B per module)",
}
LORA_SEED = 1234
ADAMW = {
    "lr": 0.01,
    "betas": [0.9, 0.95],
    "eps": 1e-08,
    "weight_decay": 0.0,
    "clip": "none",
    "note": "one step on the trainable parameters, then the same batch",
}
# full_orpo trains every parameter but records the gradients of layer 1, the final norm and
# lm_head only (the file's size); its step2 moves them all
FULL_ORPO_RECORDED = ("model.layers.1.", "model.norm.", "lm_head.")

RECORDS = [
    {"kind": "text", "prompt": [1, 17, 42, 99, 7, 120], "chosen": [55, 61, 8, 2],
     "rejected": [201, 13, 13, 90, 44, 3, 2]},
    {"kind": "conversational",
     "prompt": [{"role": "system", "content": [150, 151]},
                {"role": "user", "content": [20, 21, 22]},
                {"role": "assistant", "content": [30, 31]},
                {"role": "user", "content": [23, 24, 25, 26]}],
     "chosen": [{"role": "assistant", "content": [32, 33, 34]}],
     "rejected": [{"role": "assistant", "content": [77, 78, 79, 80, 81]}]},
    {"kind": "text", "prompt": [1, 9, 10, 11], "chosen": [70, 71, 72, 73, 2],
     "rejected": [70, 88, 89, 90, 2]},
    {"kind": "text", "prompt": [1] + list(range(160, 169)), "chosen": list(range(100, 111)) + [2],
     "rejected": list(range(180, 199)) + [2]},
]

CASES = [
    ("lora_dpo_sigmoid", {"mode": "lora", "objective": "dpo", "loss_type": "sigmoid", "beta": 0.1}),
    ("lora_dpo_robust", {"mode": "lora", "objective": "dpo", "loss_type": "robust", "beta": 0.1,
                         "label_smoothing": 0.1}),
    ("lora_dpo_cdpo", {"mode": "lora", "objective": "dpo", "loss_type": "cdpo", "beta": 0.1,
                       "label_smoothing": 0.1, "formula_only": True}),
    ("lora_dpo_ipo", {"mode": "lora", "objective": "dpo", "loss_type": "ipo", "beta": 0.1}),
    ("lora_orpo", {"mode": "lora", "objective": "orpo", "beta": 0.1}),
    ("full_dpo_sigmoid", {"mode": "full", "objective": "dpo", "loss_type": "sigmoid", "beta": 0.1}),
    ("full_orpo", {"mode": "full", "objective": "orpo", "beta": 0.1}),
]

LAYOUT = {
    "batch.*": "the DPO batch as TRL's DataCollatorForPreference builds it: rows 0-3 prompt+chosen of pairs 0-3, rows 4-7 prompt+rejected; completion_mask 1 on completion tokens (token t predicts t+1)",
    "lora_init.<peft name>": "adapter values before the step (names with PEFT's .default.)",
    "<case>.loss": "[1]",
    "<case>.chosen_logps/rejected_logps": "[4] policy (DPO: summed; ORPO: mean over completion tokens), float64 path",
    "<case>.ref_*_logps": "[4] reference (DPO)",
    "<case>.grad.<name>": "every trainable parameter's gradient (full_orpo: layer 1, final norm and lm_head only); names without PEFT's base_model.model. prefix",
    "json cases.<case>": "loss, metrics (TRL's names), step2 (after one AdamW step), formula (float64), trl_vs_formula (relative errors)",
}
SEMANTICS = {
    "dpo": "loss = mean over pairs of the per-pair loss; z = beta ((pc - rc) - (pr - rr)) with summed completion log-probs; sigmoid -logsig(z); robust (-(1-e) logsig(z) + e logsig(-z)) / (1-2e); cdpo -(1-e) logsig(z) - e logsig(-z); ipo (dc/nc - dr/nr - 1/(2 beta))^2 with per-token means",
    "dpo_metrics": "rewards/chosen = mean beta (pc - rc), rewards/rejected likewise, accuracies = mean of chosen > rejected rewards, margins = mean difference; logps/* = mean summed log-probs",
    "orpo": "loss = NLL(chosen, over every non-pad token after the first: prompt included, TRL's) - beta mean(logsig(log_odds)); log_odds = (ac - ar) - (log(1-exp ac) - log(1-exp ar)) with per-token mean log-probs a; rewards = beta a",
}
PEFT_PREFIX = "base_model.model."


# ---- the pairs, rendered at the id level (the template TRL's tokenizer gets in jinja) -------
def render(messages, generation_prompt):
    ids = [BOS]
    for m in messages:
        ids += [ROLES[m["role"]]] + list(m["content"]) + [EOS]
    return ids + ([ROLES["assistant"]] if generation_prompt else [])


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def pair_ids(rec):
    """prompt_ids, chosen_ids, rejected_ids as TRL's DPO tokenize_fn splits them."""
    if rec["kind"] == "text":
        return list(rec["prompt"]), list(rec["chosen"]), list(rec["rejected"])
    p = render(rec["prompt"], True)
    pc = render(rec["prompt"] + rec["chosen"], False)
    pr = render(rec["prompt"] + rec["rejected"], False)
    n = min(common_prefix(p, pc), common_prefix(p, pr))
    return p[:n], pc[n:], pr[n:]


def formula_batch(pairs):
    """DataCollatorForPreference's batch (keep_start truncation, right padding), in numpy."""
    rows, masks = [], []
    for side in ("chosen_ids", "rejected_ids"):
        for p in pairs:
            rows.append((p["prompt_ids"] + p[side])[:MAX_LENGTH])
            masks.append(([0] * len(p["prompt_ids"]) + [1] * len(p[side]))[:MAX_LENGTH])
    t = max(len(r) for r in rows)
    ids = np.full((len(rows), t), PAD, dtype=np.int64)
    att = np.zeros((len(rows), t), dtype=np.int64)
    comp = np.zeros((len(rows), t), dtype=np.int64)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = r
        att[i, : len(r)] = 1
        comp[i, : len(m)] = m
    return {"input_ids": ids, "attention_mask": att, "completion_mask": comp}


# ---- the float64 formula path -----------------------------------------------------------
def load_model_weights():
    from safetensors.numpy import load_file

    return load_file(os.path.join(MODEL_DIR, "model.safetensors"))


def trainable_names(case, model):
    return sorted(model.lora) if case["mode"] == "lora" else sorted(model.w)


def recorded(case, grads):
    """The gradients a case keeps in the safetensors."""
    if case["mode"] == "full" and case["objective"] == "orpo":
        return {n: g for n, g in grads.items() if n.startswith(FULL_ORPO_RECORDED)}
    return grads


def formula_eval(model, ref_s, batch, case):
    ids, att, comp = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    logits, cache = model.forward(ids, att, use_lora=True)
    s, probs = F.token_logps(logits, ids)
    cmask = comp[:, 1:].astype(np.float64)
    if case["objective"] == "dpo":
        loss, ds, logps, metrics = F.dpo_loss(s, ref_s, cmask, case)
    else:
        loss, ds, logps, metrics = F.orpo_loss(s, cmask, att, case["beta"])
    return loss, logps, metrics, (ds, probs, cache)


def formula_case(weights, lora_init, batch, case):
    """The float64 figures of a case: loss, metrics, logps, gradients and step2."""
    model = F.TinyLlama(MODEL_DIR, weights)
    if case["mode"] == "lora":
        model.set_lora({k[len(PEFT_PREFIX):]: v for k, v in lora_init.items()}, LORA["scale"])
    ref_s = None
    if case["objective"] == "dpo":  # reference: adapters off (LoRA) or the start weights (full)
        ref_logits, _ = model.forward(batch["input_ids"], batch["attention_mask"], use_lora=False)
        ref_s, _ = F.token_logps(ref_logits, batch["input_ids"])
    loss, logps, metrics, (ds, probs, cache) = formula_eval(model, ref_s, batch, case)
    all_grads = model.backward(F.dlogits_from(ds, probs, batch["input_ids"]), cache)
    names = trainable_names(case, model)
    grads = {n: all_grads[n] for n in names}
    state = {}
    model.assign(F.adamw_step(model.params(names), grads, state, ADAMW["lr"], ADAMW["betas"],
                              ADAMW["eps"], ADAMW["weight_decay"]))
    loss2, _, metrics2, _ = formula_eval(model, ref_s, batch, case)
    return {"loss": loss, "metrics": metrics, "logps": logps, "grads": recorded(case, grads),
            "step2": {"loss": loss2, "metrics": metrics2}}


def formula_json(fc):
    return {"loss": fc["loss"], "metrics": fc["metrics"], "step2": fc["step2"]}


# ---- comparisons between the paths ---------------------------------------------------------
def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    den = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / den) if den > 0 else float(np.linalg.norm(a - b))


def trl_vs_formula(trl, fc):
    out = {"loss": rel(trl["loss"], fc["loss"]), "step2.loss": rel(trl["step2"]["loss"], fc["step2"]["loss"])}
    for k, v in fc["metrics"].items():
        out["metric " + k] = rel(trl["metrics"][k], v)
    out["grads (max over tensors)"] = max(rel(trl["grads"][n], g) for n, g in fc["grads"].items())
    return out


def worst(cases):
    keys = ("loss", "step2.loss", "grads (max over tensors)")
    return max(c["trl_vs_formula"][k] for c in cases.values() if "trl_vs_formula" in c for k in keys)


# ---- writing -------------------------------------------------------------------------------
def write_golden(out_dir, pairs, batch, lora_init, results, versions, trl_error):
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    tensors = {"batch." + k: v.astype(np.int32) for k, v in batch.items()}
    tensors.update({"lora_init." + k: np.asarray(v, dtype=np.float32) for k, v in lora_init.items()})
    cases = {}
    for name, case in CASES:
        r = results[name]
        cases[name] = r["json"]
        if r.get("loss") is not None:
            tensors[name + ".loss"] = np.array([r["loss"]], dtype=np.float32)
        for k, v in r["logps"].items():
            tensors[f"{name}.{k}"] = np.asarray(v, dtype=np.float32)
        for k, v in r["grads"].items():
            tensors[f"{name}.grad.{k}"] = np.asarray(v, dtype=np.float32)
    doc = {
        "cases": cases,
        "trl_error": trl_error,
        "generator": "tests/golden_gen/dpo_golden.py",
        "versions": versions,
        "device": "cpu, 1 thread",
        "model": "tiny-mha (../shared/golden/tiny-mha), fp32 weights; TRL path in fp32, formula path in float64",
        "max_length": MAX_LENGTH,
        "truncation_mode": TRUNCATION,
        "pad_id": PAD,
        "bos_id": BOS,
        "eos_id": EOS,
        "template": TEMPLATE,
        "pairs": pairs,
        "lora": LORA,
        "adamw_step2": ADAMW,
    }
    if any("trl_vs_formula" in c for c in cases.values()):
        doc["worst_trl_vs_formula"] = worst(cases)
    doc["layout"] = LAYOUT
    doc["semantics"] = SEMANTICS
    with open(os.path.join(out_dir, "dpo_golden.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    save_file(tensors, os.path.join(out_dir, "dpo_golden.safetensors"))


def build_pairs():
    pairs = []
    for rec in RECORDS:
        p, c, r = pair_ids(rec)
        pairs.append({"prompt_ids": p, "chosen_ids": c, "rejected_ids": r, "record": rec})
    return pairs


def read_lora_init(path):
    """An earlier golden's adapter init: PEFT name -> array (its lora_init.* tensors)."""
    from safetensors.numpy import load_file

    init = {k[len("lora_init."):]: v for k, v in load_file(path).items() if k.startswith("lora_init.")}
    if not init:
        sys.exit(f"{path}: no lora_init.* tensors")
    return init


def formula_only(args):
    """The formula path of every case, without torch: `formula` figures, logps, the batch and
    the formula-only cases' loss and gradients (TRL cases keep none of TRL's figures)."""
    from safetensors.numpy import load_file

    pairs = build_pairs()
    batch = formula_batch(pairs)
    init = read_lora_init(args.lora_init)
    weights = load_model_weights()
    results = {}
    for name, case in CASES:
        fc = formula_case(weights, init, batch, case)
        if case.get("formula_only"):
            js = {"settings": case, "source": "formula-float64", **formula_json(fc), "formula": formula_json(fc)}
            results[name] = {"json": js, "loss": fc["loss"], "logps": fc["logps"], "grads": fc["grads"]}
        else:  # TRL's figures (loss, metrics, gradients) are left out: only the formula's
            js = {"settings": case, "source": "trl", "formula": formula_json(fc)}
            results[name] = {"json": js, "loss": None, "logps": fc["logps"], "grads": {}}
    versions = {"python": platform.python_version(), "numpy": np.__version__, "formula_only": True}
    write_golden(args.out, pairs, batch, init, results, versions, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (dpo_golden.json, dpo_golden.safetensors)")
    ap.add_argument("--formula-only", action="store_true", help="numpy formula path only (no torch)")
    ap.add_argument("--lora-init", help="a safetensors holding lora_init.* tensors (an earlier golden): the "
                    "adapters start there instead of the seeded draw (to check a golden made again)")
    args = ap.parse_args()
    if args.formula_only:
        if not args.lora_init:
            ap.error("--formula-only needs --lora-init")
        formula_only(args)
    else:
        import dpo_trl

        dpo_trl.generate(args)


if __name__ == "__main__":
    main()
