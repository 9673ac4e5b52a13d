#!/usr/bin/env python3
"""Compare two DPO golden folders (dpo_golden.json + dpo_golden.safetensors); numpy/safetensors only.

  python3 tests/golden_gen/compare_dpo_golden.py REF NEW [--tol 1e-5] [--only-common]

Prints, per tensor, ||new - ref|| / ||ref|| (integer tensors: the count of differing entries),
and per JSON figure |new - ref| / max(|ref|, 1e-3) (the floor keeps figures that are near zero by
nature, such as a reward margin, from turning fp32 rounding into a large relative error); the
`trl_vs_formula` and `worst_trl_vs_formula` figures, relative errors themselves, by their
absolute difference. Strings and booleans must be equal (`versions` is printed, not compared).
Exits 1 when any difference is above --tol, or when a figure or tensor of REF is missing from NEW
(--only-common: compare only what both hold, and say how much that was).
"""

import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

FLOOR = 1e-3
ABSOLUTE = ("trl_vs_formula", "worst_trl_vs_formula")


def flatten(doc, prefix=""):
    out = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}{k}." if prefix or k else k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix.rstrip(".")] = doc
    return out


def figure_diff(key, a, b):
    """The difference of one JSON leaf; None when it cannot be a number (then equality)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        d = abs(float(b) - float(a))
        if any(part in key.split(".") for part in ABSOLUTE):
            return d
        return d / max(abs(float(a)), FLOOR)
    return None


def tensor_diff(a, b):
    if a.shape != b.shape:
        return float("inf"), f"shape {a.shape} vs {b.shape}"
    if np.issubdtype(a.dtype, np.integer):
        n = int(np.count_nonzero(a != b))
        return (0.0 if n == 0 else float("inf")), f"{n} entries differ"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    den = np.linalg.norm(a64)
    d = float(np.linalg.norm(b64 - a64) / den) if den > 0 else float(np.linalg.norm(b64 - a64))
    return d, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("new")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--only-common", action="store_true")
    args = ap.parse_args()
    bad = []
    compared = 0

    ta = load_file(os.path.join(args.ref, "dpo_golden.safetensors"))
    tb = load_file(os.path.join(args.new, "dpo_golden.safetensors"))
    for name in sorted(ta):
        if name not in tb:
            if not args.only_common:
                print(f"MISSING tensor {name}")
                bad.append(name)
            continue
        d, note = tensor_diff(ta[name], tb[name])
        compared += 1
        flag = "FAIL" if d > args.tol else "ok"
        print(f"{flag:4} tensor {name:70} {d:.3e} {note}")
        if d > args.tol:
            bad.append(name)
    extra = sorted(set(tb) - set(ta))
    if extra:
        print(f"note: {len(extra)} tensors only in {args.new}: {', '.join(extra[:5])}")

    with open(os.path.join(args.ref, "dpo_golden.json")) as f:
        ja = json.load(f)
    with open(os.path.join(args.new, "dpo_golden.json")) as f:
        jb = json.load(f)
    print("versions ref:", json.dumps(ja.get("versions")))
    print("versions new:", json.dumps(jb.get("versions")))
    ja.pop("versions", None)
    jb.pop("versions", None)
    fa, fb = flatten(ja), flatten(jb)
    worst = 0.0
    for key in sorted(fa):
        if key not in fb:
            if not args.only_common:
                print(f"MISSING figure {key}")
                bad.append(key)
            continue
        compared += 1
        d = figure_diff(key, fa[key], fb[key])
        if d is None:
            if fa[key] != fb[key]:
                print(f"FAIL figure {key}: {fa[key]!r} vs {fb[key]!r}")
                bad.append(key)
            continue
        worst = max(worst, d)
        if d > args.tol:
            print(f"FAIL figure {key:70} {d:.3e} ({fa[key]!r} vs {fb[key]!r})")
            bad.append(key)
        elif isinstance(fa[key], float):
            print(f"ok   figure {key:70} {d:.3e}")
    print(f"compared {compared} tensors and figures (of {len(ta) + len(fa)} in {args.ref}); "
          f"worst JSON figure {worst:.3e}; {len(bad)} above {args.tol:g} or missing")
    if compared == 0:
        print("nothing compared")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
