"""References for tests/integration/test_chat_data.sh (run in the CI venv: transformers,
tokenizers, jinja2; no torch).

    chat_data_ref.py gen DIR         conversations and alpaca records of our own -> DIR/*.jsonl
                                     (think.jsonl: with Qwen3's reasoning and tool responses)
    chat_data_ref.py chat TEMPLATE TOKENIZER_JSON JINJA BOS EOS DATA DUMP
        transformers' apply_chat_template renders each conversation (the trailing generation
        header of the Llama 3 template dropped), tokenizers encodes the whole text, and the
        labels follow from the characters each token covers (the loss spans of
        ../shared/data/README.md); DUMP (fsdpctl tokenize --dump-jsonl) must hold the same.
    chat_data_ref.py alpaca TOKENIZER_JSON EOS SEQ_LEN DATA DUMP
        a port of fsdp_qlora's InstructionDataset (its prompt, tokenizer.encode with the
        special tokens, EOS appended, the prompt's token count masked, cut at the context
        length); samples left without a label are the ones fsdpd drops.
    chat_data_ref.py text TOKENIZER_JSON EOS DATA DUMP
"""
import json
import random
import sys

from tokenizers import Tokenizer

ALPACA_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                "further context. Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
                   "### Response:")
WORDS = ["the", "sky", "is", "blue", "Réponse", "数字", "ok", "12345", "3 + 4", "—", "✓", "a,b",
         "(x)", "tab\there", "line\nbreak", "don't", "über", "  spaced  ", "emoji 🙂", "\u00a0nbsp"]


def phrase(rng, lo=1, hi=8):
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    return rng.choice(["", " ", "\n", "  "]) + text + rng.choice(["", " ", "\n", "?", "."])


def conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": phrase(rng)})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": phrase(rng)})
        messages.append({"role": "assistant", "content": phrase(rng)})
    return {"messages": messages}


def think_conversation(rng):
    """Qwen3's cases: reasoning in assistant turns, tool responses as user turns."""
    conv = conversation(rng)
    for m in conv["messages"]:
        r = rng.random()
        if m["role"] == "assistant" and r < 0.5:
            m["content"] = (rng.choice(["", "\n", "<think>", "<think>\n", "x<think>"]) + phrase(rng) +
                            rng.choice(["", "\n", "\n\n"]) + "</think>" + rng.choice(["", "\n", "\n\n"]) +
                            m["content"] + rng.choice(["", "</think>tail"]))
        elif m["role"] == "user" and r < 0.2:
            m["content"] = "<tool_response>" + m["content"] + "</tool_response>"
    return conv


def gen(out):
    with open(f"{out}/think.jsonl", "w", encoding="utf-8") as f:
        rng = random.Random(43)
        for _ in range(60):
            f.write(json.dumps(think_conversation(rng)) + "\n")
    rng = random.Random(25)
    with open(f"{out}/chat.jsonl", "w", encoding="utf-8") as f:
        for _ in range(60):
            f.write(json.dumps(conversation(rng)) + "\n")
    with open(f"{out}/alpaca.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):
            rec = {"instruction": phrase(rng), "output": phrase(rng, 1, 12)}
            if i % 2:
                rec["input"] = phrase(rng)
            elif i % 4 == 2:
                rec["input"] = ""
            f.write(json.dumps(rec) + "\n")
    with open(f"{out}/text.jsonl", "w", encoding="utf-8") as f:
        for _ in range(20):
            f.write(json.dumps({"text": phrase(rng, 1, 20)}) + "\n")


def after_until(text, start, end):
    """The spans from after each `start` through the next `end`."""
    spans, at = [], 0
    while (i := text.find(start, at)) >= 0:
        j = text.index(end, i + len(start)) + len(end)
        spans.append((i + len(start), j))
        at = j
    return spans


def loss_spans(template, text, messages):
    """(start, end) character spans that carry the loss."""
    spans, at = [], 0
    if template in ("llama2", "mistral"):
        return after_until(text, " [/INST]", "</s>")
    if template in ("mistral-v3", "mistral-tekken"):
        return after_until(text, "[/INST]", "</s>")
    if template in ("qwen2", "qwen2.5", "qwen3"):
        return after_until(text, "<|im_start|>assistant\n", "<|im_end|>")
    for m in messages:
        if m["role"] != "assistant":
            continue
        if template == "llama3":
            head, body, end = "<|start_header_id|>assistant<|end_header_id|>\n\n", m["content"].strip(), "<|eot_id|>"
        else:  # chatml
            head, body, end = "<|im_start|>assistant\n", m["content"], "<|im_end|>"
        i = text.index(head + body + end, at) + len(head)
        spans.append((i, i + len(body) + len(end)))
        at = i
    return spans


def compare(want, dump):
    got = [json.loads(line) for line in open(dump, encoding="utf-8")]
    if len(got) != len(want):
        sys.exit(f"{dump}: {len(got)} samples, expected {len(want)}")
    for n, (w, g) in enumerate(zip(want, got)):
        if w != g:
            sys.exit(f"{dump}: sample {n}: fsdpctl gave\n  {g}\nexpected\n  {w}")


def chat(template, tokenizer_json, jinja_path, bos, eos, data, dump):
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json, bos_token=bos, eos_token=eos)
    jinja = open(jinja_path, encoding="utf-8").read()
    if jinja_path.endswith(".json"):
        jinja = json.load(open(jinja_path, encoding="utf-8"))["chat_template"]
    tk = Tokenizer.from_file(tokenizer_json)
    want = []
    for line in open(data, encoding="utf-8"):
        messages = json.loads(line)["messages"]
        if template in ("mistral-v3", "mistral-tekken") and messages[0]["role"] == "system" and messages[-1]["role"] != "user":
            # fsdpd's rule (data/chat_template.h): the system message joins the last user
            # turn, where the template puts it when the conversation ends with that turn
            last = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages = [dict(m) for m in messages[1:]]
            messages[last - 1]["content"] = json.loads(line)["messages"][0]["content"] + "\n\n" + messages[last - 1]["content"]
        text = hf.apply_chat_template(messages, tokenize=False, chat_template=jinja)
        gen_header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
        if template == "llama3":
            assert text.endswith(gen_header)
            text = text[: -len(gen_header)]
        enc = tk.encode(text, add_special_tokens=False)
        spans = loss_spans(template, text, messages)
        labels = [i if any(s <= a and b <= e for s, e in spans) else -100
                  for i, (a, b) in zip(enc.ids, enc.offsets)]
        want.append({"input_ids": enc.ids, "labels": labels})
    compare(want, dump)


def alpaca(tokenizer_json, eos, seq_len, data, dump):
    tk = Tokenizer.from_file(tokenizer_json)
    eos_id = tk.token_to_id(eos)
    want = []
    for line in open(data, encoding="utf-8"):
        ann = json.loads(line)
        prompt = (ALPACA_NO_INPUT if ann.get("input", "") == "" else ALPACA_INPUT).format_map(ann)
        prompt_ids = tk.encode(prompt).ids
        example = tk.encode(prompt + ann["output"]).ids + [eos_id]
        labels = [-100] * len(prompt_ids) + example[len(prompt_ids):]
        example, labels = example[:seq_len], labels[:seq_len]
        if any(x != -100 for x in labels):
            want.append({"input_ids": example, "labels": labels})
    compare(want, dump)


def text(tokenizer_json, eos, data, dump):
    tk = Tokenizer.from_file(tokenizer_json)
    want = []
    for line in open(data, encoding="utf-8"):
        ids = tk.encode(json.loads(line)["text"]).ids + [tk.token_to_id(eos)]
        want.append({"input_ids": ids, "labels": ids})
    compare(want, dump)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "gen":
        gen(*args)
    elif cmd == "chat":
        chat(*args)
    elif cmd == "alpaca":
        alpaca(args[0], args[1], int(args[2]), args[3], args[4])
    elif cmd == "text":
        text(*args)
    else:
        sys.exit(f"unknown command {cmd}")
