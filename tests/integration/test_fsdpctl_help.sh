#!/usr/bin/env bash
# fsdpctl's usage texts (F39): `fsdpctl --help` and each command's own usage list every flag
# the READMEs document for it, and a bad flag or a space-separated override names itself
# rather than printing only the usage.
source "$(dirname "$0")/lib.sh"

python3 - "$fsdpctl" README.md ctl/README.md daemon/README.md <<'PY' || fail "usage texts lack documented flags"
import re, subprocess, sys
fsdpctl = sys.argv[1]
docs = {}
for path in sys.argv[2:]:
    for line in open(path):
        for m in re.finditer(r"fsdpctl ([a-z]+)((?: +(?:[^`|\s]+|\|))*)", line):
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(2)):
                docs.setdefault(m.group(1), set()).add(flag)
top = subprocess.run([fsdpctl, "--help"], capture_output=True, text=True).stdout
entries, current = {}, None
for line in top.splitlines():
    m = re.match(r"^  fsdpctl ([a-z]+)", line)
    if m: current = m.group(1)
    elif not line.startswith("   "): current = None
    if current: entries[current] = entries.get(current, "") + line + "\n"
missing = []
for cmd, flags in sorted(docs.items()):
    if cmd not in entries: missing.append("fsdpctl --help has no command %s" % cmd); continue
    own = subprocess.run([fsdpctl, cmd, "--help"], capture_output=True, text=True)
    for f in sorted(flags - {"--help"}):
        if f not in entries[cmd]: missing.append("fsdpctl --help: %s lacks %s" % (cmd, f))
        if f not in own.stdout + own.stderr: missing.append("fsdpctl %s --help lacks %s" % (cmd, f))
print("\n".join(missing) or "%d commands' documented flags all in their usage" % len(docs))
sys.exit(1 if missing else 0)
PY
expect_error 2 "fsdpctl tokenize: --bogus: unknown flag" "$fsdpctl" tokenize --tokenizer x --bogus
expect_error 2 "fsdpctl tokenize: --seq-len: needs a value" "$fsdpctl" tokenize --seq-len
expect_error 2 "fsdpctl plan: --train.lr: an override is --section.key=value, with '='" \
    "$fsdpctl" plan job.json --train.lr 1e-4
expect_error 2 "fsdpctl plan: --nodes needs a value" "$fsdpctl" plan job.json --nodes
expect_error 2 "fsdpctl status: --bogus: unknown flag" "$fsdpctl" status --bogus
expect_error 2 "fsdpctl status: --socket: needs a value" "$fsdpctl" status --socket
expect_error 2 "fsdpctl plot: --out: needs a value" "$fsdpctl" plot m.jsonl --out
for cmd in init synth consolidate merge quantize inspect fabric; do
    expect_error 2 "fsdpctl $cmd: --bogus: unknown flag" "$fsdpctl" "$cmd" --bogus
done
expect_error 2 "fsdpctl init: --out: needs a value" "$fsdpctl" init --model-config c.json --out
expect_error 2 "fsdpd: 'stray': unexpected argument (flags look like --name value or --name=value)" \
    "$fsdpd" --train.lr 1e-4 stray
expect_error 2 "fsdpd: --lr: needs a value (--lr VALUE or --lr=VALUE)" "$fsdpd" --lr
expect_error 2 "fsdpd: --learning_rat: unknown option (did you mean --learning_rate?)" "$fsdpd" --learning_rat 1
echo "usage texts and flag errors as documented"
