"""RoPE frequencies and attention factor as transformers computes them, for
test_rope_scaling.sh: python rope_ref.py CONFIG_DIR... prints, for each directory, the lines
`fsdpctl inspect --rope` prints ("inv_freq I VALUE", "attention_factor VALUE").

transformers' rope init functions (modeling_rope_utils.ROPE_INIT_FUNCTIONS) are run as they
are, on the config AutoConfig reads from the directory: torch is not installed, so the few
torch calls they make (arange, clamp, where, .to/.float) are given to them over numpy
float32, the dtype torch computes them in."""
import sys
import types

import numpy as np
import transformers.modeling_rope_utils as rope_utils
from transformers import AutoConfig


class Tensor(np.ndarray):
    def to(self, device=None, dtype=None):
        return self if dtype is None else self.astype(dtype).view(Tensor)

    def float(self):
        return self.astype(np.float32).view(Tensor)


def arange(*args, dtype=None, device=None):
    return np.arange(*args, dtype=dtype or np.int64).view(Tensor)


rope_utils.torch = types.SimpleNamespace(
    float=np.float32, float32=np.float32, int64=np.int64, arange=arange,
    clamp=lambda x, lo, hi: np.clip(x, lo, hi).view(Tensor),
    where=lambda c, a, b: np.where(c, a, b).view(Tensor),
    tensor=lambda v, dtype=None, device=None: np.asarray(v, dtype=dtype).view(Tensor))

for directory in sys.argv[1:]:
    config = AutoConfig.from_pretrained(directory)
    config.standardize_rope_params()
    kind = config.rope_parameters["rope_type"]
    inv_freq, factor = rope_utils.ROPE_INIT_FUNCTIONS[kind](config, None)
    print(f"# {directory} {kind}")
    for i, f in enumerate(np.asarray(inv_freq, dtype=np.float32)):
        print(f"inv_freq {i} {float(f):.9g}")
    print(f"attention_factor {float(factor):.17g}")
