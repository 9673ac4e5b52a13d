#!/usr/bin/env bash
# fsdpctl's tokenizer against the Hugging Face `tokenizers` package (PyPI, in a venv at
# ${FSDP_VENV:-/tmp/fsdp-venv}, created or extended on first use): a few thousand seeded random
# strings per tokenizer, in both special-token modes, with and without the post-processor, and
# the decoding of every result (tests/integration/tokenizer_diff.py).  The tokenizers:
# tests/fixtures/tokenizers' sp32k (Llama 2's format; its vocabulary is Mistral v0.1's, checked here
# against mistral-common's tokenizer.model.v1) and llama3; Qwen2.5's and Qwen3's, built from
# dashscope's qwen.tiktoken; Mistral v0.3's SentencePiece model (mistral-common) as
# transformers converts it, and Mistral Nemo's tekken (mistral-common's tekken_240718.json) as
# transformers' MistralConverter writes it (tests/integration/tokenizer_files.py).
# Exits 77 (skipped, with the reason) when the venv cannot be made.
source "$(dirname "$0")/lib.sh"

use_venv tokenizers==0.23.3 "transformers==5.17.0" tiktoken sentencepiece protobuf
main_venv=$venv
# transformers' tekken converter needs mistral-common, which pins numpy below the shared
# venv's: a venv of its own.
FSDP_VENV=$main_venv-mistral use_venv tokenizers==0.23.3 "transformers==5.17.0" mistral-common==1.13.1
mistral_venv=$venv
venv=$main_venv
pypi_file qwen_tiktoken dashscope==2.0.2 dashscope/resources/qwen.tiktoken
pypi_file mistral_v1 mistral-common==1.13.1 mistral_common/data/tokenizer.model.v1
pypi_file mistral_v3 mistral-common==1.13.1 mistral_common/data/mistral_instruct_tokenizer_240323.model.v3
pypi_file tekken mistral-common==1.13.1 mistral_common/data/tekken_240718.json
files() { "${py:-$venv/bin/python}" tests/integration/tokenizer_files.py "$@" 2> "$tmp/files.err" || { cat "$tmp/files.err"; fail "tokenizer_files.py $1"; }; }
files qwen "$qwen_tiktoken" qwen2.5 "$tmp/qwen2.5"
files qwen "$qwen_tiktoken" qwen3 "$tmp/qwen3"
files spm "$mistral_v3" "$tmp/mistral-v0.3"
py=$mistral_venv/bin/python files tekken "$tekken" "$tmp/tekken"

# The published sizes: Qwen2.5 151,643 + 22, Qwen3 + 26 (config vocab_size 151936, padded);
# Mistral v0.1 32,000, v0.3 32,768, tekken 131,072 (1,000 special tokens first).
# The Qwen tokenizer.json gives the ids of Qwen's own tokenizer (dashscope's: NFC, then
# tiktoken with Qwen's pattern over qwen.tiktoken).
"$venv/bin/python" - "$tmp" "$mistral_v1" "$fixtures/tokenizers/sp32k-tokenizer.json" "$qwen_tiktoken" <<'PY' || fail "the tokenizer files"
import base64, json, random, sys, unicodedata
import sentencepiece, tiktoken
from tokenizers import Tokenizer
sys.path.insert(0, "tests/integration")
from tokenizer_files import QWEN_PATTERN
from tokenizer_diff import random_text
tmp, v1, sp32k, qwen_tiktoken = sys.argv[1:]
ranks = {base64.b64decode(t): int(r) for t, r in (l.split() for l in open(qwen_tiktoken, "rb") if l.strip())}
qwen = tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
tk = Tokenizer.from_file(f"{tmp}/qwen2.5/tokenizer.json")
rng = random.Random(7)
for _ in range(1000):
    t = random_text(rng).replace("<|", "<")
    assert tk.encode(t, add_special_tokens=False).ids == qwen.encode_ordinary(unicodedata.normalize("NFC", t)), t
for name, want in [("qwen2.5", 151665), ("qwen3", 151669), ("mistral-v0.3", 32768), ("tekken", 131072)]:
    got = Tokenizer.from_file(f"{tmp}/{name}/tokenizer.json").get_vocab_size(with_added_tokens=True)
    assert got == want, f"{name}: {got} tokens, expected {want}"
sp = sentencepiece.SentencePieceProcessor(model_file=v1)
vocab = json.load(open(sp32k, encoding="utf-8"))["model"]["vocab"]
assert sp.get_piece_size() == len(vocab) == 32000, "sp32k is not Mistral v0.1's size"
assert all(vocab[sp.id_to_piece(i)] == i for i in range(32000)), "sp32k is not Mistral v0.1's vocabulary"
PY

l3=$(fixture tokenizers/llama3-tokenizer.json)
for tok in "$fixtures/tokenizers/sp32k-tokenizer.json" "$l3" \
    "$tmp/qwen2.5/tokenizer.json" "$tmp/qwen3/tokenizer.json" "$tmp/mistral-v0.3/tokenizer.json" \
    "$tmp/tekken/tokenizer.json"; do
    "$venv/bin/python" tests/integration/tokenizer_diff.py "$fsdpctl" "$tok" "${TOKENIZER_DIFF_COUNT:-3000}" 24 "$tmp" ||
        fail "$tok: fsdpctl's ids differ from the tokenizers package"
done
echo "ok"
