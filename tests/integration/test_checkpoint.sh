#!/usr/bin/env bash
# Sharded checkpoint saves (F6).  A committed checkpoint has every file with the sizes and
# checksums of its manifest (checked here in Python, independently of proto/ckpt.c) and its
# master sections hold the trained parameters; checkpoint.keep holds; no_shard writes one
# file; a requested checkpoint commits; a worker SIGKILLed while writing leaves `latest` at
# the previous checkpoint; a rank stalled during an async save gets its commit abandoned
# within timeout + 5 s while training goes on and the next checkpoint commits; a rank stalled
# during a sync save stops the job within timeout + 10 s with the reason.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
ck=$tmp/ckpt

# run NAME [VAR=VALUE ...] -- [overrides...]: runs fsdpd; sets $status.
run() {
    local name=$1
    shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    status=0
    env "${envs[@]+"${envs[@]}"}" "$fsdpd" --job "$tmp/job.json" --runtime.metrics="$tmp/$name.jsonl" "$@" \
        > "$tmp/$name.log" 2>&1 || status=$?
}
must_succeed() { [ "$status" -eq 0 ] || { cat "$tmp/$1.log"; fail "run $1 failed"; }; }
steps_of() { ls "$1" | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tr '\n' ' '; }
latest_of() { readlink "$1/latest" || echo none; }
no_partials() { ! ls "$1" | grep -q partial || fail "partial directories left in $1: $(ls "$1")"; }
# Seconds since the epoch of the first log line matching a pattern.
log_time() { date -d "$(grep -m1 -e "$2" "$1" | cut -d' ' -f1)" +%s.%N; }

# verify_checkpoint DIR [FINAL_PARAMS.safetensors]: sizes, header and section CRC32Cs against
# the manifest; with a safetensors file, the master sections equal its tensors bit for bit.
verify_checkpoint() {
    python3 - "$@" <<'EOF' || fail "checkpoint $1 does not match its manifest"
import json, os, struct, sys
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    table.append(c)
def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ table[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
assert m["format"] == "fsdpd-checkpoint" and m["version"] == 1
assert m["global_sample"] == m["step"] * m["global_batch"]
units, n = m["units"], m["n_files"]
assert [f["name"] for f in m["files"]] == ["rank-%05d-of-%05d.bin" % (r, n) for r in range(n)]
master = [bytearray() for _ in units]
for f in m["files"]:
    data = open(os.path.join(d, f["name"]), "rb").read()
    assert len(data) == f["bytes"], (f["name"], len(data), f["bytes"])
    magic, version, hb, rank, nf, nu, ns, step, size = struct.unpack_from("<8s6IQQ", data)
    assert (magic, version, rank, nf, nu, ns, step, size) == (
        b"FSDPCKPT", 1, f["rank"], n, len(units), 3 * len(units), m["step"], len(data)), f["name"]
    header = bytearray(data[:hb])
    header[60:64] = bytes(4)
    stored = struct.unpack_from("<I", data, 60)[0]
    assert crc32c(header) == stored == f["header_crc32c"], f["name"] + ": header CRC"
    for i in range(ns):
        kind, unit, off, nbytes, crc = struct.unpack_from("<IIQQI", data, 64 + 32 * i)
        assert (kind, unit) == (1 + i // len(units), i % len(units)) and off % 4096 == 0
        assert nbytes == 4 * units[unit]["shard"] and off + nbytes <= len(data)
        assert crc32c(data[off:off + nbytes]) == crc, "%s: section %d CRC" % (f["name"], i)
        if kind == 1:
            master[unit] += data[off:off + nbytes]
if len(sys.argv) > 2:
    st = open(sys.argv[2], "rb").read()
    hlen = struct.unpack_from("<Q", st)[0]
    header = json.loads(st[8:8 + hlen])
    tensors = 0
    for u, unit in enumerate(units):
        for t in unit["tensors"]:
            a, b = header[t["name"]]["data_offsets"]
            want = st[8 + hlen + a:8 + hlen + b]
            got = bytes(master[u][4 * t["offset"]:4 * t["offset"] + len(want)])
            assert got == want, t["name"] + ": master differs from the trained parameters"
            tensors += 1
    assert tensors == len(header) - ("__metadata__" in header)
print("%s: %d files, sizes and CRC32Cs match the manifest" % (d, n))
EOF
}

# --- saves every 2 steps, keep 2, 3 ranks: the last two commit, the first is pruned --------
# (sync saves: an async one would be skipped if the one before were still being written)
run keep FSDP_FAULTS=final_params="$tmp/final.safetensors" -- --runtime.workers_per_node=3 \
    --train.micro_batch=2 --train.max_steps=6 --checkpoint.interval_steps=2 --checkpoint.async=false
must_succeed keep
[ "$(steps_of "$ck")" = "4 6 " ] || fail "expected step-000004 and step-000006 (keep 2), got: $(ls "$ck")"
[ "$(latest_of "$ck")" = step-000006 ] || fail "latest -> $(latest_of "$ck")"
grep -q "removed .*step-000002 (checkpoint.keep = 2)" "$tmp/keep.log" || fail "step 2 was not pruned"
no_partials "$ck"
verify_checkpoint "$ck/step-000004"
verify_checkpoint "$ck/step-000006" "$tmp/final.safetensors"
grep -q '"world_size": 3' "$ck/step-000006/manifest.json" || fail "manifest world_size"
grep -q '"tokens_seen": [1-9]' "$ck/step-000006/manifest.json" || fail "manifest tokens_seen"

# --- no_shard: every rank holds the whole state, rank 0 writes it -----------------------------
rm -rf "$ck"
run noshard -- --runtime.workers_per_node=3 --train.micro_batch=2 --fsdp.sharding=no_shard
must_succeed noshard
[ "$(ls "$ck/step-000004")" = "$(printf 'manifest.json\nrank-00000-of-00001.bin')" ] \
    || fail "no_shard should write one file: $(ls "$ck/step-000004")"
verify_checkpoint "$ck/step-000004"

# --- a requested checkpoint (what SIGUSR1 and the status socket will send) -------------------
rm -rf "$ck"
run request FSDP_FAULTS=ckpt_request=2 -- --train.max_steps=60 --checkpoint.keep=5
must_succeed request
grep -q "checkpoint requested" "$tmp/request.log" || fail "no request logged"
steps=$(steps_of "$ck")
[ "${steps%% *}" -lt 60 ] && [ "${steps%% *}" -ge 2 ] || fail "no checkpoint before the end: $steps"
echo "requested checkpoint committed at step ${steps%% *}"

# --- a worker SIGKILLed halfway through writing: latest stays at the previous checkpoint ------
rm -rf "$ck"
run die FSDP_FAULTS=ckpt_write=1:die:3 -- --train.max_steps=8 --checkpoint.interval_steps=2
[ "$status" -ne 0 ] || fail "the job succeeded although a worker died"
grep -q "test fault: dying while writing" "$tmp/die.log" || { cat "$tmp/die.log"; fail "the fault did not fire"; }
grep -q "rank 1 was killed by signal 9" "$tmp/die.log" || { cat "$tmp/die.log"; fail "the death was not reported"; }
[ "$(latest_of "$ck")" = step-000002 ] || fail "latest -> $(latest_of "$ck"), expected step-000002"
[ "$(steps_of "$ck")" = "2 " ] || fail "expected only step-000002: $(ls "$ck")"
no_partials "$ck"
verify_checkpoint "$ck/step-000002"
assert_gone $(worker_pids "$tmp/die.log")

# --- a rank stalled during an async save: abandoned, training goes on, the next one commits ---
rm -rf "$ck"
run stall FSDP_FAULTS=ckpt_write=1:stall:2 -- --train.max_steps=8 --checkpoint.interval_steps=2 \
    --checkpoint.timeout_s=2
must_succeed stall
grep -q "checkpoint of step 2 abandoned: rank 1 did not finish writing" "$tmp/stall.log" \
    || { cat "$tmp/stall.log"; fail "the stalled save was not abandoned naming rank 1"; }
abandoned_after=$(awk -v a="$(log_time "$tmp/stall.log" "step 2 abandoned")" \
    -v b="$(log_time "$tmp/stall.log" "checkpoint of step 2 (async)")" 'BEGIN { printf "%.2f", a - b }')
awk -v t="$abandoned_after" 'BEGIN { exit !(t <= 2 + 5) }' || fail "abandoned after $abandoned_after s"
# Training went on while rank 1 was stuck: every step ran before the abandonment.
[ "$(grep -n "step 8/8" "$tmp/stall.log" | cut -d: -f1)" -lt "$(grep -n "step 2 abandoned" "$tmp/stall.log" | cut -d: -f1)" ] \
    || fail "training did not go on during the stalled save"
[ "$(latest_of "$ck")" = step-000008 ] || fail "the next checkpoint did not commit: latest -> $(latest_of "$ck")"
[ ! -e "$ck/step-000002" ] || fail "the abandoned save was committed"
no_partials "$ck"
verify_checkpoint "$ck/step-000008"
echo "async stall: abandoned ${abandoned_after} s after the save began; step 8 committed"

# --- a rank stalled during a sync save: the job stops with the reason -------------------------
rm -rf "$ck"
start=$(date +%s.%N)
run syncstall FSDP_FAULTS=ckpt_write=1:stall:2 -- --train.max_steps=1000 --checkpoint.interval_steps=2 \
    --checkpoint.timeout_s=2 --checkpoint.async=false
elapsed=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { printf "%.2f", a - b }')
[ "$status" -ne 0 ] || fail "the job succeeded although a sync save missed its deadline"
grep -q "job failed: checkpoint of step 2 (sync): rank 1 did not finish writing within checkpoint.timeout_s = 2 s" \
    "$tmp/syncstall.log" || { cat "$tmp/syncstall.log"; fail "the reason is not given"; }
awk -v t="$elapsed" 'BEGIN { exit !(t <= 2 + 10) }' || fail "the job took $elapsed s to stop"
[ "$(latest_of "$ck")" = none ] || fail "a checkpoint was committed"
no_partials "$ck"
assert_gone $(worker_pids "$tmp/syncstall.log")
echo "sync stall: the job stopped after ${elapsed} s"
echo "ok"
