#!/usr/bin/env bash
# LoRA jobs end to end (F27) on the CPU backend, over a small pretrained base:
#  - adapters trained at 1 and 2 workers agree (1e-5): the adapters' init and the dropout
#    masks are keyed by seed, sample, layer and module, never by rank;
#  - activation checkpointing redraws the same dropout masks (the same losses, bit for bit);
#  - a checkpoint holds the adapters only (PEFT's names), their AdamW state and the base's
#    fingerprint; a crash and a resume give the uninterrupted run's bits;
#  - resuming with another base, or as a full fine-tune, is refused, naming why;
#  - rsLoRA (lora.rslora, r 16, alpha 16): one step of the golden Llama from the golden's init
#    gives PEFT's loss and adapters (tests/fixtures/golden/tiny-mha/rslora*, 1e-5).
source "$(dirname "$0")/lib.sh"

write_base_job lora
"$fsdpctl" init --model-config "$tmp/model.json" --out "$tmp/other-base" --seed 6 > /dev/null

# run NAME [FAULT ...] -- [overrides...]: run_job, the final adapters in $tmp/NAME.safetensors.
run() {
    local name=$1
    shift
    run_job "$name" "final_params=$tmp/$name.safetensors" "$@"
}
same_losses() { # A B TOL
    join "$tmp/$1.loss" "$tmp/$2.loss" > "$tmp/joined"
    [ "$(wc -l < "$tmp/joined")" -ge "${4:-6}" ] || fail "too few common steps in $1 and $2"
    awk -v tol="$3" '{ d = $2 - $3; if (d < 0) d = -d; m = $3 < 0 ? -$3 : $3
                       if ((tol == 0 && $2 != $3) || d > tol * m) { bad = 1; print } } END { exit bad }' \
        "$tmp/joined" || fail "losses of $1 and $2 differ"
}

# --- 2 workers, 1 worker, and 2 workers recomputing: the same adapters --------------------------
run two -- --checkpoint.dir="$tmp/ck2"
must_succeed two
run one -- --checkpoint.dir="$tmp/ck1" --runtime.workers_per_node=1
must_succeed one
same_losses two one 1e-5
"$fsdpctl" compare "$tmp/one.safetensors" "$tmp/two.safetensors" --rtol 1e-5 > "$tmp/cmp.out" ||
    { cat "$tmp/cmp.out"; fail "1 and 2 workers trained other adapters"; }
run recompute -- --checkpoint.dir="$tmp/ck3" --fsdp.activation_checkpointing=full
must_succeed recompute
same_losses two recompute 0
run nodropout -- --checkpoint.dir="$tmp/ck4" --lora.dropout=0
must_succeed nodropout
join "$tmp/two.loss" "$tmp/nodropout.loss" | awk '$2 != $3 { d = 1 } END { exit !d }' ||
    fail "dropout 0.1 changed nothing"

# --- the output: a PEFT adapter directory, and the merged model --------------------------------
run output -- --checkpoint.dir="$tmp/ck5" --runtime.workers_per_node=1 --output.consolidate=true \
    --output.merge=true --output.dir="$tmp/out5" --train.max_steps=3
must_succeed output
[ -f "$tmp/out5/adapter_config.json" ] && [ -f "$tmp/out5/adapter_model.safetensors" ] ||
    { ls -l "$tmp/out5"; fail "no PEFT adapter directory"; }
[ -f "$tmp/out5/merged/config.json" ] || fail "no merged model"
"$fsdpctl" merge "$tmp/base" "$tmp/out5" "$tmp/merged-again" --dtype bf16 > /dev/null
"$fsdpctl" compare "$tmp/merged-again" "$tmp/out5/merged" --rtol 0 > "$tmp/cmp.out" ||
    { cat "$tmp/cmp.out"; fail "fsdpctl merge of the written adapter differs from output.merge"; }
grep -q '"r": 4' "$tmp/out5/adapter_config.json" && grep -q '"lora_alpha": 8' "$tmp/out5/adapter_config.json" ||
    fail "adapter_config.json lacks the job's rank and alpha"

# --- lora.init_from: a PEFT adapter to start from (lr 0 at step 1: it comes back unchanged) ------
run from -- --checkpoint.dir="$tmp/ck6" --lora.init_from="$tmp/out5" --train.max_steps=1
must_succeed from
"$fsdpctl" compare "$tmp/from.safetensors" "$tmp/out5/adapter_model.safetensors" --rtol 0 > "$tmp/cmp.out" ||
    { cat "$tmp/cmp.out"; fail "lora.init_from did not start from the adapter"; }
run fromr8 -- --checkpoint.dir="$tmp/ck7" --lora.init_from="$tmp/out5" --lora.rank=8 --train.max_steps=1
[ "$status" -ne 0 ] && grep -q 'holds adapters of rank 4' "$tmp/fromr8.log" ||
    { cat "$tmp/fromr8.log"; fail "an adapter of another rank was not refused"; }

# --- what the checkpoint holds ------------------------------------------------------------------
python3 - "$tmp/ck2/step-000006/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
a = m["adapter"]
assert a["type"] == "lora" and a["rank"] == 4 and a["alpha"] == 8 and a["rslora"] is False, a
assert a["targets"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], a
assert len(a["base_fingerprint"]) == 64, a
names = [t["name"] for u in m["units"] for t in u["tensors"]]
assert len(m["units"]) == 2 and len(names) == 28, (len(m["units"]), len(names))
assert names[0] == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", names[0]
assert all(".lora_A.weight" in n or ".lora_B.weight" in n for n in names), names
shapes = {t["name"]: t["shape"] for u in m["units"] for t in u["tensors"]}
assert shapes["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"] == [4, 70]
assert shapes["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"] == [36, 4]
PY
[ "$(python3 -c 'import json,sys; print(sum(f["bytes"] for f in json.load(open(sys.argv[1]))["files"]))' \
    "$tmp/ck2/step-000006/manifest.json")" -lt 200000 ] || fail "the checkpoint holds more than adapters"

# --- crash after step 4, resume: the uninterrupted run's bits -----------------------------------
run crashed worker=0:exit:4 -- --checkpoint.dir="$tmp/ckr"
[ "$status" -ne 0 ] || fail "the crashing run succeeded"
[ "$(readlink "$tmp/ckr/latest")" = step-000003 ] || { cat "$tmp/crashed.log"; fail "latest is not step 3"; }
cp -a "$tmp/ckr" "$tmp/ckr-copy"
run resumed -- --checkpoint.dir="$tmp/ckr" --checkpoint.resume=auto
must_succeed resumed
grep -q 'resuming from .*step-000003' "$tmp/resumed.log" || fail "the run did not resume"
same_losses two resumed 0 3
cmp "$tmp/two.safetensors" "$tmp/resumed.safetensors" || fail "resumed adapters differ from the uninterrupted run's"

# --- refusals: another base, a full fine-tune ---------------------------------------------------
run otherbase -- --checkpoint.dir="$tmp/ckr-copy" --checkpoint.resume=auto --model.path="$tmp/other-base"
[ "$status" -ne 0 ] || fail "resuming on another base was accepted"
grep -q 'model (fingerprint) is [0-9a-f]* in the checkpoint, [0-9a-f]* in this job' "$tmp/otherbase.log" &&
    grep -q 'a checkpoint of another job' "$tmp/otherbase.log" || { cat "$tmp/otherbase.log"; fail "no reason given"; }
run asfull -- --checkpoint.dir="$tmp/ckr-copy" --checkpoint.resume=auto "${as_full[@]}"
[ "$status" -ne 0 ] || fail "a full fine-tune resumed adapters"
grep -q 'an adapter checkpoint, but the job is a full fine-tune' "$tmp/asfull.log" || { cat "$tmp/asfull.log"; fail "no reason given"; }
# --- QLoRA: the base quantized to NF4 at load, or a bnb-4bit directory of it as it is ---------
run q2 -- --checkpoint.dir="$tmp/ckq2" --train.type=qlora --train.max_steps=4
must_succeed q2
grep -q 'quantized to NF4' "$tmp/q2.log" || fail "the QLoRA base was not quantized"
run q1 -- --checkpoint.dir="$tmp/ckq1" --train.type=qlora --train.max_steps=4 --runtime.workers_per_node=1
must_succeed q1
same_losses q2 q1 1e-5 4
"$fsdpctl" compare "$tmp/q1.safetensors" "$tmp/q2.safetensors" --rtol 1e-5 > "$tmp/cmp.out" ||
    { cat "$tmp/cmp.out"; fail "QLoRA on 1 and 2 workers trained other adapters"; }
join "$tmp/two.loss" "$tmp/q2.loss" | awk '$2 != $3 { d = 1 } END { exit !d }' || fail "NF4 changed no loss"
"$fsdpctl" quantize "$tmp/base" "$tmp/base-bnb4" > /dev/null
run qbnb -- --checkpoint.dir="$tmp/ckqb" --train.type=qlora --train.max_steps=4 --model.path="$tmp/base-bnb4"
must_succeed qbnb
grep -q 'NF4 as saved' "$tmp/qbnb.log" || fail "the bnb-4bit base was not loaded as saved"
same_losses q2 qbnb 0 4
run bnblora -- --checkpoint.dir="$tmp/ckbl" --model.path="$tmp/base-bnb4"
[ "$status" -ne 0 ] && grep -q 'bitsandbytes 4-bit model: it trains with train.type qlora only' "$tmp/bnblora.log" ||
    { cat "$tmp/bnblora.log"; fail "a LoRA job on a bnb-4bit base was not refused"; }

# --- a random base (benchmarks): it runs, its fingerprint is that of its config and seed -------
run random -- --checkpoint.dir="$tmp/ckrand" --model.path= --model.init=random \
    --model.config="$tmp/model.json" --train.max_steps=2
must_succeed random
grep -q '"base_fingerprint": "[0-9a-f]\{64\}"' "$tmp/ckrand/step-000002/manifest.json" || fail "no fingerprint for a random base"
# --- rsLoRA against PEFT: one fsdpd step from rslora_expected's init.* ---------------------------
golden=$fixtures/golden/tiny-mha
python3 - "$golden/rslora_expected.safetensors" "$tmp/rs-init" <<'PY'
import json, os, struct, sys
src, out = sys.argv[1:]
f = open(src, "rb")
n = struct.unpack("<Q", f.read(8))[0]
head = json.loads(f.read(n))
data = f.read()
keep = {k[len("init."):].replace(".default.weight", ".weight"): v for k, v in head.items() if k.startswith("init.")}
blobs, header, at = [], {}, 0
for k, v in sorted(keep.items()):
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    header[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [at, at + len(b)]}
    blobs.append(b)
    at += len(b)
header["__metadata__"] = {"format": "pt"}
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
os.makedirs(out)
with open(out + "/adapter_model.safetensors", "wb") as w:
    w.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
loss = head["loss"]["data_offsets"][0]
print(struct.unpack("<f", data[loss:loss + 4])[0], file=open(out + "/loss", "w"))
PY
cp "$golden/rslora/adapter_config.json" "$tmp/rs-init/"
"$fsdpctl" tokenize --from-safetensors "$golden/batch.safetensors" --out "$tmp/golden.tokens" > /dev/null
"$fsdpd" --job "$tmp/job.json" --model.path="$golden" --model.dtype=f32 --data.path="$tmp/golden.tokens" \
    --data.seq_len=33 --data.shuffle=false --train.global_batch=2 --train.micro_batch=2 --train.max_steps=1 \
    --train.lr=1e-3 --train.schedule=constant --train.warmup_steps=0 --train.weight_decay=0 --train.clip_norm=0 \
    --lora.rank=16 --lora.alpha=16 --lora.rslora=true --lora.dropout=0 --lora.init_from="$tmp/rs-init" \
    --runtime.workers_per_node=1 --checkpoint.dir="$tmp/ckrs" --output.consolidate=true --output.dtype=f32 \
    --output.dir="$tmp/outrs" --runtime.metrics="$tmp/rs.jsonl" > "$tmp/rs.log" 2>&1 || { cat "$tmp/rs.log"; fail "the rsLoRA job failed"; }
python3 - "$tmp/rs.jsonl" "$(cat "$tmp/rs-init/loss")" <<'PY' || fail "rsLoRA: fsdpd's loss is not PEFT's"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
want = float(sys.argv[2])
assert len(m) == 1 and abs(m[0]["loss"] - want) <= 1e-5 * want, (m, want)
print("rsLoRA step: loss %.7f, PEFT %.7f" % (m[0]["loss"], want))
PY
"$fsdpctl" compare "$tmp/outrs/adapter_model.safetensors" "$golden/rslora/adapter_model.safetensors" --rtol 1e-5 \
    > "$tmp/cmp.out" || { cat "$tmp/cmp.out"; fail "rsLoRA: fsdpd's adapters after a step are not PEFT's"; }
grep -q '^28 tensors compared' "$tmp/cmp.out" || { cat "$tmp/cmp.out"; fail "rsLoRA: not every adapter compared"; }
grep -q '"use_rslora": true' "$tmp/outrs/adapter_config.json" || fail "rsLoRA: the adapter written is not use_rslora"
tail -1 "$tmp/cmp.out"
echo "lora: ok"
