"""The TRL path of the DPO golden (dpo_golden.py imports it; needs torch, transformers, PEFT, TRL).

TRL is the installed one, or else the carried wheel dev-carry/wheels/trl-1.16.0-py3-none-any.whl
unpacked into a temporary folder; `datasets` is always the stub in datasets_stub/ (the GPU
machine has none, and the golden records it under versions.stood_in).
"""

import glob
import os
import platform
import sys
import tempfile
import zipfile

import numpy as np

import dpo_golden as G

HERE = os.path.dirname(os.path.abspath(__file__))
# nothing outside the GPU machine can be reached: no hub look-ups, no telemetry (read by
# huggingface_hub when it is first imported, so before transformers, PEFT or TRL)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# the datasets stub first on the path, before transformers caches is_datasets_available()
sys.path.insert(0, os.path.join(HERE, "datasets_stub"))

WHEELS = os.path.join(G.REPO, "dev-carry", "wheels", "trl-1.16.0-py3-none-any.whl")
TRL_VERSION = "1.16.0"

# the id-level chat template of dpo_golden.TEMPLATE, over tokens "<id>" split on whitespace
CHAT_TEMPLATE = (
    "{% set roles = {'user': 3, 'assistant': 4, 'system': 6} %}<1>"
    "{% for m in messages %} <{{ roles[m['role']] }}> {{ m['content'] }} <2>{% endfor %}"
    "{% if add_generation_prompt %} <4>{% endif %}"
)


def import_trl():
    """Import TRL (the datasets stub is on the path already); from the carried wheel if needed."""
    try:
        import trl  # noqa: F401
    except ImportError:
        wheels = glob.glob(WHEELS)
        if not wheels:
            sys.exit(f"TRL is not installed and {WHEELS} is missing: "
                     f"pip download trl=={TRL_VERSION} --no-deps -d dev-carry/wheels, then carry dev-carry")
        target = tempfile.mkdtemp(prefix="trl-wheel-")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(target)
        sys.path.insert(1, target)  # after the stub
        import trl  # noqa: F401
    import trl

    if trl.__version__ != TRL_VERSION:
        sys.exit(f"TRL {trl.__version__} found, the golden is made with {TRL_VERSION}")
    return trl


def tokens(ids):
    return " ".join(f"<{i}>" for i in ids)


def dataset_rows():
    """The pairs as TRL's preference records: strings of "<id>" tokens, or chat messages."""
    rows = []
    for rec in G.RECORDS:
        if rec["kind"] == "text":
            rows.append({"prompt": tokens(rec["prompt"]), "chosen": " " + tokens(rec["chosen"]),
                         "rejected": " " + tokens(rec["rejected"])})
        else:
            def msgs(ms):
                return [{"role": m["role"], "content": tokens(m["content"])} for m in ms]

            rows.append({"prompt": msgs(rec["prompt"]), "chosen": msgs(rec["chosen"]),
                         "rejected": msgs(rec["rejected"])})
    return rows


def make_tokenizer(vocab_size):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token=f"<{G.PAD}>"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=f"<{G.BOS}>", eos_token=f"<{G.EOS}>",
                                   pad_token=f"<{G.PAD}>", unk_token=f"<{G.PAD}>")
    fast.chat_template = CHAT_TEMPLATE
    probe = fast("<1> <5> <2>")["input_ids"]
    if list(probe) != [1, 5, 2]:
        raise RuntimeError(f"the id-level tokenizer adds or changes tokens: '<1> <5> <2>' -> {probe}")
    return fast


def load_policy():
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(G.MODEL_DIR, dtype=torch.float32)


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=G.LORA["r"], lora_alpha=G.LORA["lora_alpha"], lora_dropout=G.LORA["lora_dropout"],
                      target_modules=list(G.LORA["target_modules"]), task_type="CAUSAL_LM")


def init_adapters(model, given=None):
    """dpo_golden.LORA['init']: A 0.1 N(0,1), B 0.05 N(0,1) from one generator, sorted names;
    or, given (PEFT name -> array, an earlier golden's lora_init.*), those values."""
    import torch

    gen = torch.Generator().manual_seed(G.LORA_SEED)
    init = {}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".lora_A." in name or ".lora_B." in name:
                if given is not None:
                    if name not in given:
                        raise RuntimeError(f"--lora-init has no {name}")
                    p.copy_(torch.from_numpy(np.asarray(given[name], dtype=np.float32)).reshape(p.shape))
                else:
                    scale = 0.1 if ".lora_A." in name else 0.05
                    p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float32))
                init[name] = p.detach().cpu().numpy().copy()
    if not init:
        raise RuntimeError("no LoRA adapter found in the trainer's model")
    if given is not None and len(init) != len(given):
        raise RuntimeError(f"--lora-init holds {len(given)} adapters, the model {len(init)}")
    return init


def common_args(case, out_dir, use_cpu=True):
    return dict(output_dir=out_dir, per_device_train_batch_size=len(G.RECORDS), max_length=G.MAX_LENGTH,
                beta=case["beta"], bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=use_cpu,
                report_to="none", disable_dropout=True, seed=42)


def build_trainer(case, out_dir, use_cpu=True):
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer
    from datasets import Dataset

    rows = dataset_rows()
    tok = make_tokenizer(211)
    peft = lora_config() if case["mode"] == "lora" else None
    if case["objective"] == "dpo":
        args = DPOConfig(**common_args(case, out_dir, use_cpu), loss_type=[case["loss_type"]],
                         label_smoothing=case.get("label_smoothing", 0.0), truncation_mode=G.TRUNCATION,
                         precompute_ref_log_probs=False)
        trainer = DPOTrainer(model=load_policy(), args=args, train_dataset=Dataset.from_list(rows[:1]),
                             processing_class=tok, peft_config=peft)
        # DPOTrainer._prepare_dataset takes a dataset's kind (string or conversational: whether
        # it adds EOS text) from its first record, and a real datasets.Dataset cannot hold both
        # kinds in one column: each record is prepared alone, as a dataset of its own kind.
        prepared = [trainer._prepare_dataset(Dataset.from_list([r]), tok, args, "train")[0] for r in rows]
        trainer.train_dataset = Dataset.from_list(prepared)
        return trainer
    args = ORPOConfig(**common_args(case, out_dir, use_cpu), remove_unused_columns=False)
    return ORPOTrainer(model=load_policy(), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                       peft_config=peft)


def trl_batch(trainer, case):
    """The collated batch and the batch tensors to compare with the formula's."""
    import torch

    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    batch = trainer.data_collator(rows)
    if case["objective"] == "dpo":
        seen = {k: batch[k] for k in ("input_ids", "attention_mask", "completion_mask")}
    else:
        cat = trainer.concatenated_inputs(batch, padding_value=trainer.padding_value)
        seen = {"input_ids": cat["concatenated_input_ids"]}
    batch = {k: (v.to(torch.device("cpu")) if hasattr(v, "to") else v) for k, v in batch.items()}
    return batch, {k: v.numpy() for k, v in seen.items()}


def last_metrics(trainer, case):
    store = trainer._metrics["train"] if case["objective"] == "dpo" else trainer._stored_metrics["train"]
    return {k: float(v[-1]) for k, v in store.items()}


def trl_case(case, out_dir, given_init=None):
    """Loss, metrics and gradients through TRL, then one AdamW step and the same batch again."""
    import torch

    trainer = build_trainer(case, out_dir)
    model = trainer.model
    init = init_adapters(model, given_init) if case["mode"] == "lora" else {}
    model.train()
    batch, seen = trl_batch(trainer, case)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    metrics = last_metrics(trainer, case)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = {n[len(G.PEFT_PREFIX):] if n.startswith(G.PEFT_PREFIX) else n: p.grad.detach().numpy().copy()
             for n, p in trainable}
    opt = torch.optim.AdamW([p for _, p in trainable], lr=G.ADAMW["lr"], betas=tuple(G.ADAMW["betas"]),
                            eps=G.ADAMW["eps"], weight_decay=G.ADAMW["weight_decay"])
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        loss2 = trainer.compute_loss(model, batch)
    return {"loss": float(loss.item()), "metrics": metrics, "grads": G.recorded(case, grads),
            "step2": {"loss": float(loss2.item()), "metrics": last_metrics(trainer, case)},
            "init": init, "seen": seen}


def generate(args):
    import peft
    import safetensors
    import torch
    import transformers

    trl = import_trl()
    torch.set_num_threads(1)
    pairs = G.build_pairs()
    batch = G.formula_batch(pairs)
    weights = G.load_model_weights()
    given = G.read_lora_init(args.lora_init) if args.lora_init else None
    results, lora_init = {}, None
    with tempfile.TemporaryDirectory(prefix="dpo-golden-") as tmp:
        for name, case in G.CASES:
            trl_res = None if case.get("formula_only") else trl_case(case, os.path.join(tmp, name), given)
            if case["mode"] == "lora":
                init = trl_res["init"] if trl_res else lora_init
                if lora_init is None:
                    lora_init = init
                if init is None or any(not np.array_equal(init[k], lora_init[k]) for k in lora_init):
                    raise RuntimeError(f"{name}: the adapter init differs from the first LoRA case's")
            if lora_init is None:
                raise RuntimeError("the first case must be a LoRA case run through TRL (its init)")
            fc = G.formula_case(weights, lora_init, batch, case)
            if trl_res is None:
                js = {"settings": case, "source": "formula-float64", **G.formula_json(fc),
                      "formula": G.formula_json(fc)}
                results[name] = {"json": js, "loss": fc["loss"], "logps": fc["logps"], "grads": fc["grads"]}
                continue
            js = {"settings": case, "source": "trl", "loss": trl_res["loss"], "metrics": trl_res["metrics"],
                  "step2": trl_res["step2"], "formula": G.formula_json(fc),
                  "trl_vs_formula": G.trl_vs_formula(trl_res, fc),
                  "batch_matches_formula": {k: bool(np.array_equal(v, batch[k])) for k, v in trl_res["seen"].items()}}
            if not all(js["batch_matches_formula"].values()):
                raise RuntimeError(f"{name}: TRL's batch differs from the formula's: {js['batch_matches_formula']}")
            results[name] = {"json": js, "loss": trl_res["loss"], "logps": fc["logps"], "grads": trl_res["grads"]}
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "peft": peft.__version__,
                "safetensors": safetensors.__version__, "trl": trl.__version__, "stood_in": ["datasets"]}
    G.write_golden(args.out, pairs, batch, lora_init, results, versions, None)
    print(f"wrote {args.out}: worst TRL vs formula {G.worst({n: r['json'] for n, r in results.items()}):.3e}")
