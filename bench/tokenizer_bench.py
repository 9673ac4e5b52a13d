"""tokenizers' encode_batch (and encode_batch_fast) over the lines of a text file with one thread (RAYON_NUM_THREADS=1,
set by tokenizer_bench.sh), no special tokens; prints MB/s of text, not counting the load.

usage: tokenizer_bench.py TOKENIZER TEXT_FILE"""
import sys
import time

from tokenizers import Tokenizer

path, text_path = sys.argv[1:3]
t0 = time.perf_counter()
tok = Tokenizer.from_file(path)
load = time.perf_counter() - t0
data = open(text_path, "rb").read()
lines = data.decode("utf-8").split("\n")


def run(encode):
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(lines), 10000):  # batches, so the Python side stays small
        tokens += sum(len(e.ids) for e in encode(lines[i:i + 10000], add_special_tokens=False))
    return time.perf_counter() - t0, tokens


# encode_batch_fast (no offsets) where this version has it
for name in ["encode_batch", "encode_batch_fast"]:
    if not hasattr(tok, name):
        continue
    s, tokens = run(getattr(tok, name))
    print(f"tokenizers {path:40s} {len(data) / 1e6:8.1f} MB in {s:6.2f} s: {len(data) / 1e6 / s:7.2f} MB/s, "
          f"{len(lines)} lines, {tokens} tokens (load {load:.2f} s; {name})")
