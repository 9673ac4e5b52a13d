"""Differential check of fsdpctl's tokenizer against the Hugging Face `tokenizers` package.

usage: tokenizer_diff.py FSDPCTL TOKENIZER.json COUNT SEED WORKDIR

Generates COUNT seeded random strings (mixed scripts, combining marks and jamo, emoji, runs of
spaces, tabs and newlines, U+00A0, U+3000, U+2028, U+0085, digits, text that looks like special
tokens), encodes them
with both in both special-token modes (add_special_tokens on and off; special-token text
matched, and with --split-special as plain text), and decodes the ids; any difference is
printed and the exit status is 1.
"""
import json
import random
import subprocess
import sys

from tokenizers import Tokenizer

WORDS = ["hello", "World", "don't", "we'LL", "I'M", "they're", "x", "CamelCase", "snake_case",
         "naïve", "façade", "Ünïcödé", "Ελληνικά", "Привет", "мир", "日本語", "のテキスト",
         "한국어", "العربية", "עברית", "हिन्दी", "ไทย", "e\u0301", "ﬁ", "Straße", "ǅ", "ſ",
         # NFC (Qwen): decomposed letters, marks out of order, jamo, singletons, a mark newer
         # than tokenizers' normalization tables
         "A\u030a", "\u212b", "\u1e0b\u0323", "a\u0301\u0316", "\u1100\u1161\u11a8",
         "\u0b47\u0b3e", "\u0344", "\u0898a\u0301", "\uac00\u11a8", "\u0f73"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n ", "\u00a0",
          "\u3000", "\u2028", "\u2029", "\u0085", "\u200b", "\ufeff", "\u000b", "\u000c",
          "\u1680", "\u2003", "\u202f"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🤖", "🦀", "✨"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "!!!!", "--", "«»", "“”", "¿", "·"]
LOOKALIKE = ["<s>", "</s>", "<unk>", "<s", "s>", "< s>", "<S>", "<|begin_of_text|>",
             "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|reserved_special_token_5|>", "<|reserved_special_token_250|>", "<|eot_id",
             "|eot_id|>", "<|begin_of_text|", "<0x41>", "[INST]", "[/INST]", "<<SYS>>"]


def random_char(rng):
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x1100, 0x11FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7A3), (0x1F300, 0x1F64F), (0x2000, 0x206F), (0xFF00, 0xFFEF),
              (0x0, 0x1F),
              # letters and digits newer than PCRE2's Unicode tables, and U+180E
              (0x31350, 0x323AF), (0x2EBF0, 0x2EE5D), (0x10D40, 0x10D49), (0x16D70, 0x16D79),
              (0x180E, 0x180E)]
    lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, hi))


def random_piece(rng):
    kind = rng.random()
    if kind < 0.30:
        return rng.choice(WORDS)
    if kind < 0.50:
        return rng.choice(SPACES) * rng.choice([1, 1, 1, 2, 5])
    if kind < 0.58:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))
    if kind < 0.66:
        return rng.choice(EMOJI)
    if kind < 0.76:
        return rng.choice(PUNCT)
    if kind < 0.86:
        return rng.choice(LOOKALIKE)
    return "".join(random_char(rng) for _ in range(rng.randint(1, 6)))


def random_text(rng):
    n = rng.choice([0, 1, 2, 3, 5, 8, 13, 30])
    return "".join(random_piece(rng) for _ in range(n))


def run_fsdpctl(fsdpctl, tok, lines_path, flags):
    out = subprocess.run([fsdpctl, "tokenize", "--tokenizer", tok, "--jsonl", lines_path] + flags,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"fsdpctl {' '.join(flags)} failed ({out.returncode}): {out.stderr}")
    return out.stdout.splitlines()


def main():
    fsdpctl, tok_path, count, seed, work = sys.argv[1:6]
    rng = random.Random(int(seed))
    texts = [random_text(rng) for _ in range(int(count))]
    tok = Tokenizer.from_file(tok_path)
    text_file = f"{work}/texts.jsonl"
    with open(text_file, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    failures = 0
    all_ids = []
    for add in (True, False):
        for split in (False, True):
            tok.encode_special_tokens = split
            want = [e.ids for e in tok.encode_batch(texts, add_special_tokens=add)]
            flags = ([] if add else ["--no-add-special"]) + (["--split-special"] if split else [])
            got = run_fsdpctl(fsdpctl, tok_path, text_file, flags)
            if len(got) != len(texts):
                sys.exit(f"fsdpctl {flags} printed {len(got)} lines for {len(texts)} texts")
            for t, w, g in zip(texts, want, got):
                g = [int(x) for x in g.split()]
                if g != w:
                    failures += 1
                    if failures <= 10:
                        print(f"MISMATCH add_special={add} split_special={split} text={t!r}\n"
                              f"  tokenizers: {w}\n  fsdpctl:    {g}")
            all_ids.extend(want)
    tok.encode_special_tokens = False
    ids_file = f"{work}/ids.jsonl"
    with open(ids_file, "w") as f:
        for ids in all_ids:
            f.write(json.dumps({"ids": ids}) + "\n")
    got = run_fsdpctl(fsdpctl, tok_path, ids_file, [])
    for ids, g in zip(all_ids, got):
        want = tok.decode(ids, skip_special_tokens=False)
        if json.loads(g)["text"] != want:
            failures += 1
            if failures <= 20:
                print(f"DECODE MISMATCH ids={ids}\n  tokenizers: {want!r}\n  fsdpctl: {json.loads(g)['text']!r}")
    print(f"{tok_path}: {len(texts)} texts x 4 modes + {len(all_ids)} decodes, {failures} differences")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
