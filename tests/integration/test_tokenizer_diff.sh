#!/usr/bin/env bash
# fsdpctl's tokenizer against the Hugging Face `tokenizers` package (PyPI, in a venv at
# ${FSDP_VENV:-/tmp/fsdp-venv}, created or extended on first use): a few thousand seeded random
# strings per family of ../shared/tokenizers, in both special-token modes, with and without the
# post-processor, and the decoding of every result (tests/integration/tokenizer_diff.py).
# Exits 77 (skipped, with the reason) when the venv cannot be made.
source "$(dirname "$0")/lib.sh"

use_venv tokenizers

for family in sp32k llama3; do
    "$venv/bin/python" tests/integration/tokenizer_diff.py "$fsdpctl" \
        "$shared/tokenizers/$family-tokenizer.json" "${TOKENIZER_DIFF_COUNT:-3000}" 24 "$tmp" ||
        fail "$family: fsdpctl's ids differ from the tokenizers package"
done
echo "ok"
