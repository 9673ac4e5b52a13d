#!/usr/bin/env python3
"""A chat data set with checkable answers, for the first command (`make tiny`).

Each line is {"messages": [...]}: arithmetic questions (sums, differences, products of small
numbers) and their answers, some with a system prompt, some with a second turn; the same
--seed gives the same file.  Every answer can be checked: `--check FILE` recomputes them.

    scripts/gen_chat_data.py --out runs/tiny-chat/chat.jsonl [--n 4000] [--seed 1]
"""
import argparse
import json
import random
import re
import sys

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
QUESTION = re.compile(r"What is (\d+) ([+*-]) (\d+)\?")
ANSWER = re.compile(r"(\d+) ([+*-]) (\d+) = (-?\d+)\.")


def turn(rng):
    op = rng.choice("+-*")
    hi = 12 if op == "*" else 99
    a, b = rng.randint(0, hi), rng.randint(0, hi)
    return ({"role": "user", "content": f"What is {a} {op} {b}?"},
            {"role": "assistant", "content": f"{a} {op} {b} = {OPS[op](a, b)}."})


def conversation(rng):
    messages = []
    if rng.random() < 0.25:
        messages.append({"role": "system", "content": "You are a careful calculator."})
    for _ in range(2 if rng.random() < 0.2 else 1):
        messages.extend(turn(rng))
    return {"messages": messages}


def check(path):
    bad = 0
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            for m in json.loads(line)["messages"]:
                got = ANSWER.fullmatch(m["content"]) if m["role"] == "assistant" else None
                if got and OPS[got[2]](int(got[1]), int(got[3])) != int(got[4]):
                    print(f"{path}:{no}: wrong answer {m['content']}", file=sys.stderr)
                    bad += 1
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check")
    a = p.parse_args()
    if a.check:
        sys.exit(1 if check(a.check) else 0)
    if not a.out:
        p.error("--out or --check is needed")
    rng = random.Random(a.seed)
    with open(a.out, "w", encoding="utf-8") as f:
        for _ in range(a.n):
            f.write(json.dumps(conversation(rng)) + "\n")


if __name__ == "__main__":
    main()
