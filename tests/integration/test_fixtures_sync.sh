#!/usr/bin/env bash
# tests/fixtures/ (golden/, tokenizers/, data/) are the team's reference data, byte for byte
# (tests/fixtures/README.md): scripts/sync-fixtures.sh --check against $FSDP_SHARED (tests/run.sh
# sets it to ../shared where there is one) passes; and the check itself, against an altered copy
# of that data, names each difference: a changed byte in a plain and in a compressed fixture, a
# reference file the fixtures lack, a fixture the reference lacks.  Skipped, and counted, with no
# reference data (a failure under CI=true).
source "$(dirname "$0")/lib.sh"

[ -n "${FSDP_SHARED:-}" ] && [ -d "$FSDP_SHARED/golden" ] ||
    skip_test "no reference data to compare tests/fixtures with: FSDP_SHARED is unset or has no golden/ (tests/fixtures/README.md)"
scripts/sync-fixtures.sh --check "$FSDP_SHARED" > "$tmp/check.out" ||
    { cat "$tmp/check.out"; fail "tests/fixtures differs from $FSDP_SHARED: run scripts/sync-fixtures.sh"; }
grep -q "tests/fixtures matches" "$tmp/check.out" || fail "sync-fixtures --check: $(cat "$tmp/check.out")"

# An altered copy of the reference data (its large fixture left out: never compared).
mkdir "$tmp/ref"
for d in golden tokenizers data; do cp -r "$FSDP_SHARED/$d" "$tmp/ref/"; done
rm -f "$tmp/ref/golden/nf4_extra.safetensors"
# flip_byte FILE OFFSET: the byte at OFFSET of FILE xor 1.
flip_byte() {
    local b
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "$(printf '\\%03o' $((b ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
flip_byte "$tmp/ref/golden/tiny-mha/config.json" 10
flip_byte "$tmp/ref/tokenizers/llama3-tokenizer.json" 5000000
rm "$tmp/ref/data/chat.jsonl"
echo '{}' > "$tmp/ref/golden/tiny-mha/new.json"
expect_status 1 "differs: tests/fixtures/golden/tiny-mha/config.json" scripts/sync-fixtures.sh --check "$tmp/ref"
for needle in "differs: tests/fixtures/tokenizers/llama3-tokenizer.json.gz" \
    "extra: tests/fixtures/data/chat.jsonl" "missing: tests/fixtures/golden/tiny-mha/new.json" \
    "run scripts/sync-fixtures.sh"; do
    grep -qF "$needle" "$tmp/cmd.out" || { cat "$tmp/cmd.out" >&2; fail "sync-fixtures --check does not say '$needle'"; }
done
[ "$(grep -c '^\(differs\|extra\|missing\):' "$tmp/cmd.out")" = 4 ] ||
    { cat "$tmp/cmd.out" >&2; fail "sync-fixtures --check reports other differences than the four made"; }
echo "test_fixtures_sync: ok"
