#!/usr/bin/env python3
"""Causal attention: our CUDA kernel beside PyTorch's scaled_dot_product_attention.

Times PyTorch's flash and cuDNN backends, and its memory-efficient one deterministic (ours
is deterministic), at the shapes of
`check_attention --bench`: Llama-2-7B (B=4, Hq=Hkv=32, hd=128) and 70B (B=4, Hq=64, Hkv=8,
hd=128) at T 2048 and 8192, and one hd=64 shape.  Tensors are laid out as ours, [B, T, H, hd]
(PyTorch gets the [B, H, T, hd] view, as a Llama model would give it); bf16, is_causal=True,
random data.  Each figure is the median of 10 timed runs (CUDA events) after 3 warm-ups.
FLOPs: forward 4*B*Hq*T^2*hd/2 (causal), backward 2.5x the forward, forward+backward 3.5x.

With --ours PATH it first runs `PATH --bench` (tests/gpu/check_attention), prints its output,
and ends with one table of both and the ratios (ours / flash, ours / cuDNN; above 1 is
faster).

    python3 bench/attn_bench.py --ours build/gpu/check_attention
"""
import argparse
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # model, B, T, Hq, Hkv, hd: the rows of check_attention --bench
    ("7B", 4, 2048, 32, 32, 128),
    ("7B", 4, 8192, 32, 32, 128),
    ("70B", 4, 2048, 64, 8, 128),
    ("70B", 4, 8192, 64, 8, 128),
    ("hd64", 4, 2048, 32, 8, 64),
]
WARMUP, REPS = 3, 10
# name, backend, deterministic: ours is deterministic; of PyTorch's, the memory-efficient
# backend is under torch.use_deterministic_algorithms(True) (one key split in its backward);
# cuDNN's deterministic backward (cuDNN >= 9.18, opt-in) is not reachable from PyTorch 2.11
# (pytorch/pytorch#182551), and flash's backward sums dQ with atomics.
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION, False),
            ("cudnn", SDPBackend.CUDNN_ATTENTION, False),
            ("eff-det", SDPBackend.EFFICIENT_ATTENTION, True)]


def fwd_flops(B, T, Hq, hd):
    return 4.0 * B * Hq * T * T * hd / 2


def median_ms(fn):
    for _ in range(WARMUP):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def attention(q, k, v, gqa):
    """q [B, T, Hq, hd], k/v [B, T, Hkv, hd] -> causal attention through SDPA's chosen backend.
    gqa: 'native' passes enable_gqa=True; 'repeat' repeats k/v per query head first."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if gqa == "repeat" and k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if k.shape[1] != q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def bench_torch(backend, deterministic, B, T, Hq, Hkv, hd):
    """(fwd ms, fwd+bwd ms, note), or None when the backend refuses these inputs."""
    dev, dt = "cuda", torch.bfloat16
    q = (2 * torch.rand(B, T, Hq, hd, device=dev, dtype=dt) - 1).requires_grad_()
    k = (2 * torch.rand(B, T, Hkv, hd, device=dev, dtype=dt) - 1).requires_grad_()
    v = (2 * torch.rand(B, T, Hkv, hd, device=dev, dtype=dt) - 1).requires_grad_()
    dout = 2 * torch.rand(B, Hq, T, hd, device=dev, dtype=dt) - 1
    result = None
    torch.use_deterministic_algorithms(deterministic)
    with sdpa_kernel(backend):
        for gqa in ("native", "repeat"):
            try:
                with torch.no_grad():
                    fwd = median_ms(lambda: attention(q, k, v, gqa))
                fb = median_ms(
                    lambda: torch.autograd.grad(attention(q, k, v, gqa), (q, k, v), dout))
                note = "k/v repeated per head (inside the timing)" if gqa == "repeat" and Hkv != Hq else ""
                result = (fwd, fb, note)
                break
            except RuntimeError as e:  # no kernel of this backend for these inputs
                last = str(e).splitlines()[0]
        else:
            print(f"  {backend}: refused B={B} T={T} Hq={Hq} Hkv={Hkv} hd={hd}: {last}")
    torch.use_deterministic_algorithms(False)
    del q, k, v, dout
    torch.cuda.empty_cache()
    return result


def run_ours(path):
    """{(model, B, T, Hq, Hkv, hd): (fwd ms, fwd+bwd ms)} from `path --bench`."""
    proc = subprocess.run([path, "--bench"], capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"attn_bench: {path} --bench exited with {proc.returncode}")
    rows = {}
    for line in proc.stdout.splitlines():
        f = line.split()
        if len(f) == 12 and f[0] in {s[0] for s in SHAPES} and f[1].isdigit():
            rows[(f[0],) + tuple(int(x) for x in f[1:6])] = (float(f[6]), float(f[10]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", metavar="PATH", help="check_attention binary to run with --bench")
    args = ap.parse_args()
    ours = run_ours(args.ours) if args.ours else {}

    props = torch.cuda.get_device_properties(0)
    print(f"\nPyTorch {torch.__version__}, {props.name}, {props.multi_processor_count} SMs; "
          f"median of {REPS} after {WARMUP} warm-ups; TFLOP/s as 4*B*Hq*T^2*hd/2 (fwd), 3.5x (fwd+bwd)")
    table = []
    for shape in SHAPES:
        model, B, T, Hq, Hkv, hd = shape
        f = fwd_flops(B, T, Hq, hd)
        row = {"shape": shape}
        for name, backend, deterministic in BACKENDS:
            r = bench_torch(backend, deterministic, B, T, Hq, Hkv, hd)
            if r:
                row[name] = (f / r[0] / 1e9, 3.5 * f / r[1] / 1e9)
                print(f"{name:7s} {model:5s} B={B} T={T:5d} Hq={Hq:2d} Hkv={Hkv:2d} hd={hd:3d}  "
                      f"fwd {r[0]:8.3f} ms {row[name][0]:6.1f} TFLOP/s   "
                      f"fwd+bwd {r[1]:8.3f} ms {row[name][1]:6.1f} TFLOP/s  {r[2]}", flush=True)
        if shape in ours:
            o = ours[shape]
            row["ours"] = (f / o[0] / 1e9, 3.5 * f / o[1] / 1e9)
        table.append(row)

    def cell(row, key, i):
        return f"{row[key][i]:7.1f}" if key in row else "      -"

    def ratio(row, peer, i):
        return f"{row['ours'][i] / row[peer][i]:5.2f}" if "ours" in row and peer in row else "    -"

    print("\nTFLOP/s              |                forward                 |"
          "            forward+backward")
    print(f"{'model':5s} {'T':>5s} {'Hq/Hkv':>6s} |   ours   flash   cudnn eff-det /fl   /cu |"
          "   ours   flash   cudnn eff-det /fl   /cu")
    for row in table:
        model, B, T, Hq, Hkv, hd = row["shape"]
        sides = []
        for i in (0, 1):
            cells = " ".join(cell(row, key, i) for key in ("ours", "flash", "cudnn", "eff-det"))
            sides.append(f"{cells} {ratio(row, 'flash', i)} {ratio(row, 'cudnn', i)}")
        print(f"{model:5s} {T:5d} {f'{Hq}/{Hkv}':>6s} |{sides[0]} |{sides[1]}")
    print("/fl, /cu: ours over flash, over cudnn (above 1: ours is faster); eff-det: PyTorch's "
          "memory-efficient backend, deterministic")


if __name__ == "__main__":
    main()
