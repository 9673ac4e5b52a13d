"""The arithmetic and the table of bench/step_bench.sh (no third-party imports).

  step_table.py flops MODEL.json SEQ     parameters and training FLOPs a token of a model json
  step_table.py peer-fig LOG GPU_PEAKS   the peer's JSON line in LOG and nvidia-smi's peaks as a
                                         figures file (stdout), the keys measured_run writes
  step_table.py table OUT                the table of OUT/rows.tsv and OUT/NAME.fig: stdout and
                                         OUT/step_bench.md; exit 1 when a peer's model is not
                                         the model json's (its parameter count differs)
  step_table.py kernels CSV STEPS [TOP]  the kernels taking the most GPU time in an nsys
                                         cuda_gpu_kern_sum CSV, per step
  step_table.py cupti STEP_S TOP TSV...  the largest process's kernel table of
                                         bench/kernel_profile.c by category and its top
                                         kernels, in ms a step of STEP_S seconds
  step_table.py comm STEP_S TSV...       NCCL's time a step and its exposed part (no other
                                         kernel beside it) in the kernel_profile.c table of
                                         the process with the most exposed: one JSON object

FLOPs a token as ../shared/bench/peer_torch.py and bench/peer_fsdp.py count them (the PaLM
convention): 6 (N - N_embedding) + 12 L d T, N every parameter, N_embedding the input
embedding (V d), over the H200's 989 TFLOP/s of dense bf16 for MFU.
"""
import csv
import json
import os
import re
import sys

PEAK_FLOPS = 989e12


def params(cfg):
    """Every parameter of a config.json of the Llama family: embedding, layers (Qwen2's q/k/v
    biases, Qwen3's q/k norms), final norm, lm_head."""
    d, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or d // heads
    attn = d * heads * hd * 2 + d * kv * hd * 2  # q, o; k, v
    if cfg.get("model_type") == "qwen2" or (cfg.get("attention_bias") and cfg.get("model_type") != "qwen3"):
        attn += heads * hd + 2 * kv * hd  # q, k, v biases
    if cfg.get("model_type") == "qwen3":
        attn += 2 * hd  # q_norm, k_norm
    mlp = 3 * d * cfg["intermediate_size"]
    layer = attn + mlp + 2 * d  # two RMSNorms
    head = 0 if cfg.get("tie_word_embeddings") else V * d
    return V * d + L * layer + d + head


def flops_per_token(cfg, seq):
    d, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    return 6 * (params(cfg) - V * d) + 12 * L * d * seq


def load_model(path):
    with open(path) as f:
        return json.load(f)


def peer_fig(log, gpu_peaks):
    lines = [l for l in open(log) if l.startswith("{")]
    if not lines:
        sys.exit(f"{log}: no JSON line from the peer")
    r = json.loads(lines[-1])
    return dict(tokens_per_s=r["tokens_per_s"], step_s=r["step_s"], gpu_mib=json.loads(gpu_peaks),
                own_peak_gib=r["peak_mem_gib"], loss=r["loss"], params=round(r["params_b"] * 1e9),
                peer_mfu=r["mfu"], optimizer=r.get("optimizer", ""))


def gib(mib_list):
    return f"{max(mib_list) / 1024:.1f}" if mib_list else "-"


def percent(x):
    """x as a percentage, 1 decimal; 2 significant digits below 1% (a CPU run's MFU)."""
    return f"{100 * x:.1f}%" if x >= 0.01 else f"{100 * x:.2g}%"


def fig_of(out, name):
    try:
        with open(os.path.join(out, name + ".fig")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def table(out):
    """rows.tsv: row, label, model json, batch, seq, side (fsdpd|peer), run name, what, status."""
    head = ["row", "run", "tokens a step", "GFLOP a token", "step s", "tokens/s", "MFU", "fsdpd / peer",
            "GPU peak GiB (nvidia-smi, a process)", "own peak GiB", "loss"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    problems = []
    rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "rows.tsv")) if l.strip()]
    peer_tps = {}
    for r in rows:
        if r[5] == "peer":
            f = fig_of(out, r[6])
            if r[8] == "ran" or r[8].startswith("reused"):
                peer_tps[r[0]] = f and f["tokens_per_s"]
    for row, label, model, batch, seq, side, name, what, status in rows:
        cfg = load_model(model)
        fpt = flops_per_token(cfg, int(seq))
        f = fig_of(out, name) if status == "ran" or status.startswith("reused") else None
        run = f"{'fsdpd' if side == 'fsdpd' else 'PyTorch FSDP2'}, {what}"
        if status.startswith("reused"):
            run += f" ({status})"
        cells = [f"{row}: {label}", run, f"{batch} x {seq}", f"{fpt / 1e9:.3f}"]
        if f is None:
            cells += [status if status != "ran" else "no figures"] + ["-"] * 6
        else:
            mfu = fpt * f["tokens_per_s"] / PEAK_FLOPS
            if side == "peer" and f.get("params") != params(cfg):
                problems.append(f"row {row}: the peer's model has {f.get('params')} parameters, "
                                f"{model} {params(cfg)}")
            ratio = "-"
            if side == "fsdpd" and peer_tps.get(row):
                ratio = f"{f['tokens_per_s'] / peer_tps[row]:.2f}x"
            own = f"{f['own_peak_gib']:.1f} " + ("(context peak allocated)" if side == "fsdpd"
                                                 else "(max_memory_allocated)")
            cells += [f"{f['step_s']:.3f}", f"{f['tokens_per_s']:,.0f}", percent(mfu), ratio,
                      gib(f["gpu_mib"]), own, f"{f['loss']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["MFU: (6 (N - N_embedding) + 12 L d T) x tokens/s / 989 TFLOP/s, from each row's model json; "
             "tokens/s = batch x seq / step time, mean of the timed steps; one GPU, so per GPU = total.",
             "GPU peak: the largest process's peak in nvidia-smi --query-compute-apps, sampled every 500 ms "
             "over the whole run, the same way on both sides."]
    text = "\n".join(lines + [""] + notes)
    print(text)
    with open(os.path.join(out, "step_bench.md"), "w") as f:
        f.write(text + "\n")
    for p in problems:
        print("MISMATCH: " + p)
    return 1 if problems else 0


def kernels(path, steps, top):
    rows = list(csv.reader(open(path, newline="")))
    start = next((i for i, r in enumerate(rows) if r and r[0].strip().startswith("Time")), None)
    if start is None:
        sys.exit(f"{path}: no kernel table (no header row starting with 'Time')")
    hdr = [h.strip() for h in rows[start]]
    col = {h.split(" (")[0].replace("(%)", "").strip(): i for i, h in enumerate(hdr)}
    data = [r for r in rows[start + 1:] if len(r) == len(hdr)]
    t_col, n_col, name_col = col["Total Time"], col["Instances"], col["Name"]
    data.sort(key=lambda r: -float(r[t_col]))
    total = sum(float(r[t_col]) for r in data)
    print(f"GPU kernel time: {total / 1e6:.1f} ms over {steps} steps = {total / 1e6 / steps:.1f} ms a step; "
          f"the top {min(top, len(data))}:")
    print(f"{'%':>6} {'ms a step':>10} {'calls a step':>12}  kernel")
    for r in data[:top]:
        t = float(r[t_col])
        print(f"{100 * t / total:6.1f} {t / 1e6 / steps:10.2f} {int(r[n_col]) / steps:12.1f}  {r[name_col][:110]}")
    return 0


# Kernel categories of a CUPTI table, first match wins (flash and cuDNN attention kernels
# have "gemm"-like parts in their names, so attention comes first).
CATEGORIES = [("attention", r"attention|flash|fmha|sdpa|attn"),
              ("GEMM", r"gemm|nvjet|xmma|cutlass|cublas|matmul"),
              ("NCCL", r"nccl"),
              ("optimizer", r"adam|multi_tensor"),
              ("cross-entropy", r"cross_entropy|log_softmax|nll_loss"),
              ("norms", r"rms|norm"),
              ("RoPE", r"rope|rotary"),
              ("other", r".")]


def profile_table(path):
    """One process's table of bench/kernel_profile.c: its span (ns), kernels (count, ns, name),
    gaps (ns, count, before, after) and communication (NCCL's busy ns, exposed ns; None when
    the table has no "# comm" line); its other "#" lines (the collector's warnings) go to
    stderr."""
    span, rows, gaps, comm = 0, [], [], None
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if f[0] == "# span_ns":
            span = int(f[1])
        elif f[0] == "# gap":
            gaps.append((int(f[2]), int(f[1]), f[3], f[4]))
        elif f[0] == "# comm":
            comm = (int(f[1]), int(f[2]))
        elif line.startswith("#"):
            print(path + ": " + line[2:].strip(), file=sys.stderr)
        elif line.strip():
            count, ns, name = line.rstrip("\n").split("\t", 2)
            rows.append((int(count), int(ns), name))
    return span, rows, gaps, comm


def comm(paths, step_s):
    """NCCL's ms a step and its exposed part, from the process whose exposed share of its span
    is the largest (the rank the collectives held up most)."""
    shares = []
    for path in paths:
        span, _, _, c = profile_table(path)
        if span > 0 and c is not None:
            shares.append((c[1] / span, c[0] / span))
    if not shares:
        sys.exit("no kernel_profile table with a span and a '# comm' line in " + " ".join(paths))
    exposed, busy = max(shares)
    print(json.dumps(dict(comm_ms=1e3 * step_s * busy, exposed_ms=1e3 * step_s * exposed)))
    return 0


def cupti(paths, step_s, top):
    """The largest process's table of bench/kernel_profile.c: its kernels by category and the
    top ones, as shares of the recorded span and ms a step (share x the run's step time)."""
    tables = []
    for path in paths:
        span, rows, gaps, c = profile_table(path)
        tables.append((sum(r[1] for r in rows), span, rows, path, gaps, c))
    busy, span, rows, path, gaps, c = max(tables)
    if not rows or span <= 0:
        sys.exit(f"{path}: no kernels recorded")
    per_step = step_s * 1e3 / span  # ms a step per ns of the span
    print(f"{path}: kernels busy {busy / 1e6:.1f} ms of a {span / 1e6:.1f} ms span ({100 * busy / span:.1f}%); "
          f"a step of {step_s * 1e3:.1f} ms:")
    cats = {}
    for count, ns, name in rows:
        cat = next(c for c, rx in CATEGORIES if re.search(rx, name, re.I))
        cats[cat] = cats.get(cat, 0) + ns
    print(f"{'category':>14} {'ms a step':>10} {'% of step':>10}")
    for cat, _ in CATEGORIES:
        if cat in cats:
            print(f"{cat:>14} {cats[cat] * per_step:10.1f} {100 * cats[cat] / span:10.1f}")
    idle = max(0, span - busy)
    print(f"{'GPU idle':>14} {idle * per_step:10.1f} {100 * idle / span:10.1f}  (or overlapped streams)")
    if c is not None:
        print(f"NCCL's kernels {c[0] * per_step:.1f} ms a step, {c[1] * per_step:.1f} of it with no other kernel beside them")
    print(f"the top {min(top, len(rows))} kernels:")
    for count, ns, name in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"{ns * per_step:8.2f} ms a step {100 * ns / span:5.1f}% {count:7d} calls  {name[:100]}")
    if gaps:
        print(f"GPU idle in gaps of 10 us or more: {sum(g[0] for g in gaps) * per_step:.1f} ms a step; "
              f"the largest by the kernels around them (before -> after):")
        for ns, count, before, after in sorted(gaps, reverse=True)[:12]:
            print(f"{ns * per_step:8.2f} ms a step {count:7d} gaps  {before[:60]} -> {after[:60]}")
    return 0


def main(argv):
    if len(argv) == 3 and argv[0] == "flops":
        cfg = load_model(argv[1])
        print(f"{argv[1]}: {params(cfg)} parameters, {flops_per_token(cfg, int(argv[2])) / 1e9:.3f} "
              f"GFLOP a token at seq {argv[2]}")
        return 0
    if len(argv) == 3 and argv[0] == "peer-fig":
        print(json.dumps(peer_fig(argv[1], argv[2])))
        return 0
    if len(argv) == 2 and argv[0] == "table":
        return table(argv[1])
    if len(argv) >= 4 and argv[0] == "cupti":
        return cupti(argv[3:], float(argv[1]), int(argv[2]))
    if len(argv) >= 3 and argv[0] == "comm":
        return comm(argv[2:], float(argv[1]))
    if len(argv) in (3, 4) and argv[0] == "kernels":
        return kernels(argv[1], int(argv[2]), int(argv[3]) if len(argv) == 4 else 15)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
