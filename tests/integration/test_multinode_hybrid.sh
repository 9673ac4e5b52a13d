#!/usr/bin/env bash
# fsdp.sharding=hybrid_shard (F33) across 2 nodes of 2 workers, the nodes network namespaces
# (netns.sh) with SLURM's variables:
# - each node shards over its own workers (the shard communicator) and replicates across the
#   nodes: the only collective on the replica communicator (the same local rank of every
#   node) is each reduce-scattered gradient shard's all-reduce (metrics' replica_collectives,
#   rank 0: 4 units x 3 micro-batches = 12 a step), the gathers stay on the node
#   (all_gathers: 3 x (1 + 2 + 1 + 2) = 18 a step, full_shard's), and node 0's interface
#   sends far fewer bytes than full_shard's over the same 4 ranks (fabric.preflight off: its
#   timed all-reduce over the world would outweigh the training's traffic);
# - the losses and the final parameters are full_shard's at the same world (to 1e-5: the
#   gradients are summed in another order, a node's pair then the two nodes');
# - node 0's ranks alone write a checkpoint (2 files, a shard group's; the manifest says
#   hybrid_shard, world 4); resumed as hybrid_shard it gives the uninterrupted run's bits,
#   and it resumes as full_shard, a full_shard checkpoint as hybrid_shard.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"
netns_available || skip_test "$NETNS_WHY"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
common=(--output.consolidate=false --runtime.join_timeout_s=20 --train.micro_batch=1
        --runtime.workers_per_node=2 --checkpoint.async=false --fabric.preflight=off)

# node I of 2 of job JOB, in host I, in the background: NETNS_PID
slurm_node() {
    local i=$1 job=$2
    shift 2
    netns_spawn "$i" "$tmp/$job-n$i.log" env SLURM_JOB_ID="$job" SLURM_NNODES=2 SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-1]" SLURMD_NODENAME="n$i" SLURM_TASKS_PER_NODE="1(x2)" \
        FSDP_FAULTS="final_params=$tmp/$job.safetensors" "$fsdpd" --job "$tmp/job.json" "${common[@]}" \
        --checkpoint.dir="$tmp/$job.ckpt" --runtime.metrics="$tmp/$job-n$i.jsonl" "$@"
}
# tx_bytes I: bytes host I's eth0 has sent
tx_bytes() { netns_exec "$1" cat /sys/class/net/eth0/statistics/tx_bytes; }
# run_nodes JOB ARGS...: both nodes, both must succeed; node 0's bytes sent in $TX
run_nodes() {
    local job=$1 i pids=() before
    shift
    before=$(tx_bytes 0)
    for i in 0 1; do slurm_node "$i" "$job" "$@"; pids+=("$NETNS_PID"); done
    for i in 0 1; do wait "${pids[$i]}" || { tail -n 5 "$tmp/$job"-n*.log; fail "$job: node $i failed"; }; done
    TX=$(($(tx_bytes 0) - before))
    sed -n 's/.*"step": *\([0-9]*\),.*"loss": *\([-0-9.e+]*\).*/\1 \2/p' "$tmp/$job-n0.jsonl" > "$tmp/$job.loss"
}
# metric JOB STEP NAME: rank 0's
metric() { sed -n "s/.*\"step\": *$2,.*\"$3\": *\([0-9]*\).*/\1/p" "$tmp/$1-n0.jsonl"; }
close() { # A B: the losses of their common steps and the final parameters, to 1e-5
    join "$tmp/$1.loss" "$tmp/$2.loss" | awk '{ d = $2 - $3; if (d < 0) d = -d; m = $3 < 0 ? -$3 : $3
        if (d > 1e-5 * m) { bad = 1; print } } END { exit bad || NR == 0 }' || fail "losses of $1 and $2 differ"
    "$fsdpctl" compare "$tmp/$1.safetensors" "$tmp/$2.safetensors" --rtol 1e-5 > "$tmp/cmp.txt" ||
        { cat "$tmp/cmp.txt"; fail "final parameters of $1 and $2 differ"; }
}
# resume_from SRC STEP JOB ARGS...: JOB starts from SRC's checkpoint of STEP
resume_from() {
    local src=$1 step=$2 job=$3
    shift 3
    mkdir -p "$tmp/$job.ckpt"
    cp -a "$tmp/$src.ckpt/step-$(printf %06d "$step")" "$tmp/$job.ckpt/"
    ln -s "step-$(printf %06d "$step")" "$tmp/$job.ckpt/latest"
    run_nodes "$job" --checkpoint.resume=auto "$@"
    grep -q "resuming from $tmp/$job.ckpt/step-0*$step" "$tmp/$job-n0.log" || { cat "$tmp/$job-n0.log"; fail "$job did not resume"; }
}

netns_up 2

run_nodes full --checkpoint.interval_steps=2
tx_full=$TX
run_nodes hybrid --fsdp.sharding=hybrid_shard --checkpoint.interval_steps=2
tx_hybrid=$TX
close full hybrid
for s in 1 4; do
    [ "$(metric hybrid $s replica_collectives)" = $((12 * s)) ] ||
        fail "hybrid: $(metric hybrid $s replica_collectives) collectives across the replicas after step $s, expected $((12 * s))"
    [ "$(metric full $s replica_collectives)" = 0 ] || fail "full_shard has a replica communicator"
    [ "$(metric hybrid $s all_gathers)" = $((18 * s)) ] && [ "$(metric full $s all_gathers)" = $((18 * s)) ] ||
        fail "all-gathers after step $s: hybrid $(metric hybrid $s all_gathers), full $(metric full $s all_gathers), expected $((18 * s))"
done
echo "node 0 sent $tx_full bytes with full_shard, $tx_hybrid with hybrid_shard"
[ $((tx_hybrid * 2)) -lt "$tx_full" ] || fail "hybrid_shard sent $tx_hybrid bytes from node 0, full_shard $tx_full"

# the checkpoint: node 0's 2 ranks wrote it
python3 - "$tmp/hybrid.ckpt/step-000004" <<'PY' || fail "hybrid: the checkpoint is not a shard group's"
import json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
assert m["sharding"] == "hybrid_shard" and m["world_size"] == 4 and m["n_files"] == 2, m
assert sorted(f["rank"] for f in m["files"]) == [0, 1], m["files"]
assert sorted(x for x in os.listdir(d) if x.endswith(".bin")) == ["rank-00000-of-00002.bin", "rank-00001-of-00002.bin"], os.listdir(d)
PY
grep -q "checkpoint $tmp/hybrid.ckpt/step-0*4 committed: 2 files" "$tmp/hybrid-n0.log" || { cat "$tmp/hybrid-n0.log"; fail "hybrid: the commit of 2 files was not logged"; }

# resumed: as hybrid_shard (the bits of the run that went on), as full_shard; and the reverse
resume_from hybrid 2 hy_hy --fsdp.sharding=hybrid_shard
cmp "$tmp/hybrid.safetensors" "$tmp/hy_hy.safetensors" || fail "a hybrid checkpoint resumed as hybrid_shard changed the bits"
resume_from hybrid 2 hy_full
close full hy_full
resume_from full 2 full_hy --fsdp.sharding=hybrid_shard
close full full_hy
echo "ok"
