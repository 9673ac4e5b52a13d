#!/usr/bin/env bash
# The layering check (tests/check_layers.py): the tree holds DESIGN.md's floors, and the
# check itself fails on an upward include (from a .c, .h, .cu or .cuh file) and on an
# include loop.
source "$(dirname "$0")/lib.sh"

python3 tests/check_layers.py . || fail "the tree breaks the layering rule"

# A copy of the tree with one upward include, then with a loop, must fail, naming them.
mkdir -p "$tmp/tree"
cp -r base model data proto kernels worker daemon ctl "$tmp/tree/" 2>/dev/null || true
echo '#include "daemon/log.h"' >> "$tmp/tree/proto/rng.c"
expect_status 1 "proto/rng.c includes daemon/log.h: proto/ may use only base" python3 tests/check_layers.py "$tmp/tree"
sed -i '$d' "$tmp/tree/proto/rng.c"
# a CUDA header is read too
echo '#include "worker/fsdp.h"' >> "$tmp/tree/kernels/cuda/cuda_attention_docs.cuh"
expect_status 1 "kernels/cuda/cuda_attention_docs.cuh includes worker/fsdp.h: kernels/ may use only base" python3 tests/check_layers.py "$tmp/tree"
sed -i '$d' "$tmp/tree/kernels/cuda/cuda_attention_docs.cuh"
echo '#include "proto/rng.h"' >> "$tmp/tree/proto/tokens.h"
echo '#include "proto/tokens.h"' >> "$tmp/tree/proto/rng.h"
expect_status 1 "include loop between the modules proto/rng, proto/tokens" python3 tests/check_layers.py "$tmp/tree"

# kernels.h lists every op kernels_ops.h's rows declare (grep and ctags cannot expand them).
python3 - <<'PY' || fail "kernels.h's list of ops is not kernels_ops.h's"
import re
rows = re.findall(r"^\s*K_OP(?:_BY_HAND)?\((?:[^,(]+, )?([a-z_0-9]+)", open("kernels/kernels_ops.h").read(), re.M)
ops = ["k_" + n for n in rows if n != "name"]
head = open("kernels/kernels.h").read()
listed = re.search(r"against kernels_ops\.h\):\n((?: \*   .*\n)+)", head).group(1)
named = re.findall(r"k_[a-z_0-9]+", listed)
assert named == ops, (sorted(set(ops) - set(named)), sorted(set(named) - set(ops)))
print("kernels.h lists the %d ops of kernels_ops.h" % len(ops))
PY
echo "layers: ok"
