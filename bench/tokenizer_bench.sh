#!/usr/bin/env bash
# Tokenizer throughput, one thread each: fsdpd's data/tokenizer (bench/tokenizer_bench.c) beside
# the Hugging Face tokenizers package's encode_batch (bench/tokenizer_bench.py, with
# RAYON_NUM_THREADS=1), over the same ~MB megabytes of text, for both tokenizers of
# tests/fixtures/tokenizers (llama3's as make unpacks it into BUILD/fixtures/).  The text is this machine's Python standard library sources and
# license files (prose, code, some non-ASCII), repeated to size.  Prints figures; asserts
# nothing.  The token counts of the two must agree (same ids, as the differential test checks).
#
# usage: bench/tokenizer_bench.sh [BUILD] [MB]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mb=${2:-50}
venv=${FSDP_VENV:-/tmp/fsdp-venv}
"$venv/bin/python" -c 'import tokenizers' 2>/dev/null ||
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q tokenizers; }

blas_cflags=$(pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu)
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -I. $blas_cflags bench/tokenizer_bench.c \
    "$build/libfsdp.a" -ljansson -lpcre2-8 -lm -o "$build/tokenizer_bench"

text=${TMPDIR:-/tmp}/fsdp-tokenizer-bench.$$.txt
trap 'rm -f "$text" "$text.src"' EXIT
pylib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$pylib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$text.src"
find /usr/share/common-licenses -type f | sort | xargs cat >> "$text.src" 2>/dev/null || true
"$venv/bin/python" - "$text.src" "$text" "$mb" <<'PY'
import sys
src, out, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(src, "rb").read().decode("utf-8", "replace").encode()
with open(out, "wb") as f:
    n = 0
    while n < mb * 1000000:
        f.write(data)
        n += len(data)
PY
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), tokenizers" \
     "$("$venv/bin/python" -c 'import tokenizers; print(tokenizers.__version__)')"
for tok in tests/fixtures/tokenizers/sp32k-tokenizer.json "$build/fixtures/tokenizers/llama3-tokenizer.json"; do
    "$build/tokenizer_bench" "$tok" "$text"
    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$venv/bin/python" bench/tokenizer_bench.py "$tok" "$text"
done
