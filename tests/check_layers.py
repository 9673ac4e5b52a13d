#!/usr/bin/env python3
"""The layering check (docs/ARCHITECTURE.md, "Floors"; DESIGN.md's "Layout"): folders depend downward only.

Reads every #include "..." of the product's C and CUDA files (.c, .h, .cu, .cuh) and fails when
  - a folder includes one it may not (the FLOORS table below is DESIGN.md's rule), or
  - modules include each other in a loop (a module is a .c/.cu with its .h).
Exceptions that are still being removed are listed in ALLOWED and ALLOWED_LOOPS with the
issue that removes them; one that no longer occurs fails the check too, so the lists cannot
go stale.
Prints what it checked and each violation; exits 1 on any."""
import os
import re
import sys

# folder -> the folders of ours it may include (besides itself)
FLOORS = {
    "base": set(),
    "proto": {"base"},
    "kernels": {"base"},
    "model": {"kernels", "proto", "base"},
    "data": {"proto", "base"},
    "worker": {"model", "data", "proto", "kernels", "base"},
    "daemon": {"model", "data", "proto", "kernels", "base"},
    # fsdpctl: its offline tools and the status client, over fsdpd's own modules (consolidate,
    # fabric, the checkpoint coordinator's checks), which fsdpd never takes from it
    "ctl": {"daemon", "model", "data", "proto", "kernels", "base"},
}

# (from-file, included file) edges allowed for now, with the issue that removes them.
ALLOWED = {}
# Module loops allowed for now (none left: F19 gave kernels/ and worker/comm the types their
# backends need in modules of their own, kernels/kctx and worker/comm_types).
ALLOWED_LOOPS = {
    # (module, module, ...) sorted, as the check prints them: "issue that removes it"
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    for folder in FLOORS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in files:
                if f.endswith((".c", ".h", ".cu", ".cuh")):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def resolve(root, src, inc):
    """An include as a path from the root: relative to the file first, then to the root."""
    beside = os.path.normpath(os.path.join(os.path.dirname(src), inc))
    if os.path.exists(os.path.join(root, beside)):
        return beside
    if os.path.exists(os.path.join(root, inc)):
        return os.path.normpath(inc)
    return None


def module(path):
    return os.path.splitext(path)[0]


def loops(graph):
    """The module graph's strongly connected components of two or more modules (Tarjan,
    iterative), each as a sorted tuple."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(tuple(sorted(comp)))
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    problems, edges, used = [], 0, set()
    graph = {}
    for src in sorted(sources(root)):
        text = open(os.path.join(root, src), encoding="utf-8", errors="replace").read()
        folder = src.split("/")[0]
        for inc in INCLUDE.findall(text):
            target = resolve(root, src, inc)
            if target is None:
                continue  # a system or generated header
            edges += 1
            to = target.split("/")[0]
            if module(target) != module(src):
                graph.setdefault(module(src), set()).add(module(target))
            if to == folder or to not in FLOORS or to in FLOORS[folder]:
                continue
            if (src, target) in ALLOWED:
                used.add((src, target))
                continue
            problems.append(f"{src} includes {target}: {folder}/ may use only "
                            f"{', '.join(sorted(FLOORS[folder])) or 'nothing of ours'}")
    for edge in sorted(set(ALLOWED) - used):
        problems.append(f"allowed exception {edge[0]} -> {edge[1]} no longer occurs: remove it")
    found = loops(graph)
    for loop in found:
        if loop not in ALLOWED_LOOPS:
            problems.append("include loop between the modules " + ", ".join(loop))
    for loop in sorted(set(ALLOWED_LOOPS) - set(found)):
        problems.append(f"allowed loop {', '.join(loop)} no longer occurs: remove it")
    for p in problems:
        print("layering:", p)
    print(f"layering: {edges} includes in {len(FLOORS)} folders, {len(used)} allowed "
          f"exception(s), {len(set(ALLOWED_LOOPS) & set(found))} allowed loop(s), "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
