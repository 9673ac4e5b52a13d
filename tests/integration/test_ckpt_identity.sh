#!/usr/bin/env bash
# A checkpoint belongs to one job (F36), reproducing the findings: with checkpoint.resume auto
# (the default) a job never resumes another job's checkpoint.  A LoRA job after a QLoRA job in
# the same checkpoint.dir, a job on another data file, an adapter job on another base, a full
# fine-tune of another model, another train.lr, a manifest without an identity (written
# before F36): each refused before any step, naming every differing field with both values
# and the two ways on (a new checkpoint.dir, checkpoint.resume=force).  force resumes anyway
# and logs the differences; train.max_steps may change (logged); the same job resumes.  The
# default checkpoint.dir is OUTPUT_DIR.checkpoints, beside the output.
source "$(dirname "$0")/lib.sh"

write_base_job qlora
"$fsdpctl" init --model-config "$tmp/model.json" --out "$tmp/other-base" --seed 6 > /dev/null
"$fsdpctl" synth --out "$tmp/other.tokens" --records 96 --seq-len 20 --vocab 61 --alphabet 12 --seed 8 > /dev/null
ck=$tmp/ckpt

# refused NAME NEEDLE... -- [overrides]: the run fails before any step; its log holds each NEEDLE
# and the two ways on.
refused() {
    local name=$1 needles=()
    shift
    while [ "$1" != -- ]; do needles+=("$1"); shift; done
    shift
    run_job "$name" -- --checkpoint.resume=auto "$@"
    [ "$status" -ne 0 ] || { cat "$tmp/$name.log"; fail "$name: resumed another job's checkpoint"; }
    [ ! -s "$tmp/$name.loss" ] || fail "$name: training steps ran"
    for n in "${needles[@]}" "start afresh in a new checkpoint.dir, or resume it anyway with checkpoint.resume=force"; do
        grep -qF -- "$n" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no mention of '$n'"; }
    done
}

# --- the QLoRA job, then the same with train.type lora -----------------------------------------
run_job qlora -- --checkpoint.resume=auto
must_succeed qlora
cp -a "$ck" "$tmp/ck-qlora"
grep -q '"train_type": "qlora"' "$ck/step-000006/manifest.json" || fail "the manifest records no identity"
refused lora "train.type is qlora in the checkpoint, lora in this job" \
    "adapter type (train.type) is qlora in the checkpoint, lora in this job" -- --train.type=lora
refused data "data (sha256) is" -- --data.path="$tmp/other.tokens"
refused base "model (fingerprint) is" -- --model.path="$tmp/other-base"
refused lr "train.lr is 0.01 in the checkpoint, 0.02 in this job" -- --train.lr=2e-2
refused dropout "lora.dropout is 0.10000000000000001 in the checkpoint, 0 in this job" -- --lora.dropout=0
diff -r "$tmp/ck-qlora" "$ck" > /dev/null || fail "a refused job changed the checkpoint directory"
echo "lora after qlora, other data, other base, other lr, other dropout: refused"

# --- the same job resumes; max_steps may change (logged) ---------------------------------------
run_job same -- --checkpoint.resume=auto --train.max_steps=8
must_succeed same
grep -q "resuming from $ck/step-000006" "$tmp/same.log" || { cat "$tmp/same.log"; fail "the same job did not resume"; }
grep -qF "train.max_steps is 6 in the checkpoint, 8 in this job (allowed" "$tmp/same.log" ||
    { cat "$tmp/same.log"; fail "the changed max_steps is not logged"; }
[ "$(cut -d' ' -f1 "$tmp/same.loss" | tr '\n' ' ')" = "7 8 " ] || fail "the resumed job should run steps 7-8"

# --- force: resumed anyway, every difference logged ---------------------------------------------
rm -rf "$ck" && cp -a "$tmp/ck-qlora" "$ck"
run_job forced -- --checkpoint.resume=force --train.type=lora --train.max_steps=7
must_succeed forced
grep -qF "train.type is qlora in the checkpoint, lora in this job (checkpoint.resume force: resumed anyway)" \
    "$tmp/forced.log" || { cat "$tmp/forced.log"; fail "force did not log the difference"; }
grep -q "resuming from $ck/step-000006" "$tmp/forced.log" || fail "force did not resume"
echo "force: resumed, differences logged"

# --- a full fine-tune of another model ----------------------------------------------------------
run_job full -- --checkpoint.dir="$tmp/ckfull" "${as_full[@]}" --checkpoint.resume=auto
must_succeed full
ck=$tmp/ckfull
refused fullother "model (fingerprint) is" -- --checkpoint.dir="$tmp/ckfull" "${as_full[@]}" \
    --model.path="$tmp/other-base"
echo "full fine-tune of another model: refused"

# --- a manifest without an identity (written before F36): refused under auto, force resumes ---
python3 - "$tmp/ckfull/step-000006/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); del m["identity"]
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
refused old "identity is (not recorded" -- --checkpoint.dir="$tmp/ckfull" "${as_full[@]}"
run_job oldforced -- --checkpoint.dir="$tmp/ckfull" "${as_full[@]}" --checkpoint.resume=force --train.max_steps=7
must_succeed oldforced
echo "a manifest without identity: refused, resumed with force"

# --- the default checkpoint.dir: beside output.dir ----------------------------------------------
python3 - "$tmp/job.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); del j["checkpoint"]["dir"]
json.dump(j, open(sys.argv[1], "w"))
PY
run_job default -- --train.max_steps=3
must_succeed default
[ -d "$tmp/out.checkpoints/step-000003" ] || { cat "$tmp/default.log"; fail "no checkpoint in OUTPUT_DIR.checkpoints"; }
! ls "$tmp/out" 2>/dev/null | grep -q step- || fail "checkpoints inside output.dir"
run_job default2 -- --train.max_steps=3 --output.dir="$tmp/out2"
must_succeed default2
grep -q resuming "$tmp/default2.log" && fail "a job with another output.dir met the first one's checkpoint"
[ -d "$tmp/out2.checkpoints/step-000003" ] || fail "no checkpoint in out2.checkpoints"
echo "default checkpoint.dir: OUTPUT_DIR.checkpoints"
echo ok
