"""TRL 1.16.0's own preference data pipeline, for tests/integration/test_pref_data.sh (in the CI
venv: transformers, tokenizers, jinja2, datasets and trl installed without its dependencies; no
torch).

    pref_data_ref.py gen DIR
        preference records of our own -> DIR/{text,conv,implicit_text,implicit_conv}.jsonl
    pref_data_ref.py check DPO_TRAINER_PY [MODEL_DIR DATA MAX_LENGTH MODE DUMP]...
        each DATA through TRL: DPOTrainer._prepare_dataset (extract_prompt where there is no prompt,
        the EOS text for string records, tokenize_fn: _tokenize of the prompt with the generation
        prompt and of prompt + chosen / rejected, the completion after their common prefix, the
        keep_start filter) on a datasets.Dataset, then DataCollatorForPreference.torch_call's
        truncation to MAX_LENGTH (MODE keep_start or keep_end); DUMP (fsdpctl tokenize
        --format preference --dump-jsonl: records 2i, 2i+1 the chosen and rejected of pair i)
        must hold the same ids and labels (-100 off the completion mask).

trl.trainer.dpo_trainer imports torch at its top, so the two functions are taken out of
DPO_TRAINER_PY's source (TRL's file, unchanged) and run as they are: _prepare_dataset with
trl.data_utils' functions (imported: they need no torch), and torch_call's statements before its
first use of torch (the truncation; the rest turns lists into tensors and pads them).  The one
stand-in is global_then_local_main_first, a barrier between processes (a no-op in one).

fsdpd drops a pair with a side left without a completion token, which TRL keeps (its log
probability then 0); the check drops them too and prints how many.
"""
import ast
import contextlib
import json
import random
import sys
import types

WORDS = ["the", "sky", "is", "blue", "Réponse", "数字", "ok", "12345", "3 + 4", "—", "✓", "a,b",
         "(x)", "tab\there", "line\nbreak", "don't", "über", "  spaced  ", "emoji 🙂"]


def phrase(rng, lo=1, hi=8):
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    return rng.choice(["", " ", "\n"]) + text + rng.choice(["", " ", "\n", "?", "."])


def turns(rng):
    msgs = [{"role": "system", "content": phrase(rng)}] if rng.random() < 0.4 else []
    for _ in range(rng.randint(0, 2)):  # earlier turns: a multi-turn prompt
        msgs += [{"role": "user", "content": phrase(rng)}, {"role": "assistant", "content": phrase(rng)}]
    return msgs + [{"role": "user", "content": phrase(rng)}]


def reply(rng, lo=1, hi=8):
    return [{"role": "assistant", "content": phrase(rng, lo, hi)}]


def gen(out):
    rng = random.Random(60)
    text = [{"prompt": phrase(rng), "chosen": phrase(rng), "rejected": phrase(rng)} for _ in range(12)]
    text += [{"prompt": "Q: 2+2?", "chosen": " 4</s>", "rejected": " 5<|end_of_text|>"},  # EOS text already there
             {"prompt": "long " * 30, "chosen": " yes", "rejected": " no"},  # the prompt fills a short max_length
             {"prompt": "Say <s> or <|eot_id|>:", "chosen": " ok " * 20, "rejected": "no"}]
    conv = [{"prompt": turns(rng), "chosen": reply(rng), "rejected": reply(rng)} for _ in range(12)]
    conv += [{"prompt": [{"role": "user", "content": "hi " * 30}], "chosen": reply(rng), "rejected": reply(rng)},
             {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
              "chosen": reply(rng, 20, 30), "rejected": reply(rng, 1, 2)}]
    implicit_conv = []
    for _ in range(8):
        p = turns(rng)
        implicit_conv.append({"chosen": p + reply(rng), "rejected": p + reply(rng)})
    implicit_text = []
    for _ in range(8):
        p = phrase(rng)
        c, r = phrase(rng), phrase(rng)
        if c[:1] == r[:1]:
            c = "A" + c
        implicit_text.append({"chosen": p + " " + c, "rejected": p + " " + r})
    for name, rows in [("text", text), ("conv", conv), ("implicit_text", implicit_text),
                       ("implicit_conv", implicit_conv)]:
        with open(f"{out}/{name}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")


def trl_functions(path):
    """_prepare_dataset and the torch-free head of DataCollatorForPreference.torch_call."""
    tree = ast.parse(open(path).read())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    method = lambda cls, name: next(n for n in classes[cls].body if isinstance(n, ast.FunctionDef) and n.name == name)
    prepare = method("DPOTrainer", "_prepare_dataset")
    call = method("DataCollatorForPreference", "torch_call")
    uses_torch = lambda node: any(isinstance(n, ast.Name) and n.id == "torch" for n in ast.walk(node))
    head = []
    for stmt in call.body:
        if uses_torch(stmt):
            break
        head.append(stmt)
    head.append(ast.Return(ast.Tuple([ast.Name(n, ast.Load()) for n in ("input_ids", "completion_mask")], ast.Load())))
    call.body = head
    call.name = "truncate"
    for f in (prepare, call):
        f.decorator_list, f.returns = [], None
        for a in f.args.args:
            a.annotation = None
    module = ast.fix_missing_locations(ast.Module([prepare, call], []))
    import datasets
    from transformers.utils import logging
    import trl.data_utils as du
    env = {"Dataset": datasets.Dataset, "IterableDataset": datasets.IterableDataset, "json": json,
           "logger": logging.get_logger("trl"), "global_then_local_main_first": contextlib.nullcontext,
           "extract_prompt": du.extract_prompt, "is_conversational": du.is_conversational,
           "_tokenize": du._tokenize, "common_prefix_length": du.common_prefix_length}
    exec(compile(module, path, "exec"), env)
    return env["_prepare_dataset"], env["truncate"]


def check(prepare, truncate, model_dir, data, max_length, mode, dump):
    """True when DUMP holds TRL's pairs of DATA."""
    import datasets
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(l) for l in open(data, encoding="utf-8") if l.strip()]
    args = types.SimpleNamespace(dataset_num_proc=None, max_length=max_length, truncation_mode=mode)
    ds = prepare(types.SimpleNamespace(_tokenizer=tok), datasets.Dataset.from_list(rows), tok, args, "train")
    examples = [{k: ds[i][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for i in range(len(ds))]
    ids, mask = truncate(types.SimpleNamespace(max_length=max_length, truncation_mode=mode), examples)
    n = len(examples)
    want = []
    for i in range(n):
        sides = [(ids[i], mask[i]), (ids[n + i], mask[n + i])]
        if all(any(m) for _, m in sides):
            want += [{"input_ids": list(t), "labels": [x if k else -100 for x, k in zip(t, m)]} for t, m in sides]
    got = [json.loads(l) for l in open(dump)]
    print(f"{data} ({mode}, max_length {max_length}): {len(rows)} records, {n} pairs after TRL's filter, "
          f"{n - len(want) // 2} left without a completion token on a side, {len(got) // 2} pairs from fsdpd")
    bad = len(got) != len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        if g != w:
            bad = True
            print(f"pair {k // 2} {'rejected' if k % 2 else 'chosen'}:\n  fsdpd {g}\n  TRL   {w}")
            break
    return not bad


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(sys.argv[2])
    else:
        fns, cases = trl_functions(sys.argv[2]), sys.argv[3:]
        ok = [check(*fns, d, data, int(n), mode, dump) for d, data, n, mode, dump in zip(*[iter(cases)] * 5)]
        sys.exit(0 if ok and all(ok) else 1)
