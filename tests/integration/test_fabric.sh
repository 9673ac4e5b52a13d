#!/usr/bin/env bash
# The fabric (F23): the probe on this machine (Debian's libfabric has efa and verbs compiled
# in but finds no device: nothing is set); EFA and InfiniBand machines faked with a fake
# sysfs root (fault fabric_root), a stub libfabric exporting fi_getinfo/fi_freeinfo that
# lists the efa provider, and a stub NCCL net plugin exporting ncclNet_v8: what is set, what
# the user set is kept, and EFA without a plugin is refused (fabric.require).  Then the
# network check across two namespace hosts: every rank's bus bandwidth is logged, and a floor
# set impossibly high (fabric.min_busbw_gbps) stops the job naming it.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/netns.sh"
command -v cc > /dev/null || fail "no C compiler for the stubs"

# --- this machine: nothing found, nothing set ---------------------------------------------
out=$("$fsdpctl" fabric 2>&1) || { echo "$out"; fail "fsdpctl fabric failed on this machine"; }
echo "$out"
grep -q "^fabric: none (EFA devices: none; InfiniBand/RoCE devices: none" <<<"$out" || fail "this machine is not 'none'"
! grep -q "fabric: [A-Z_]*=" <<<"$out" || fail "variables were set on a machine without a fabric"

# --- the stubs -------------------------------------------------------------------------------
root=$tmp/root
mkdir -p "$root/opt/amazon/efa/lib64" "$root/drivers/efa" "$root/drivers/mlx5_core"
cat > "$tmp/fabric_stub.c" <<'C'
#include <rdma/fabric.h>
#include <stdlib.h>
#include <string.h>
int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
               const struct fi_info *hints, struct fi_info **info) {
    (void)version, (void)node, (void)service, (void)flags, (void)hints;
    struct fi_info *i = calloc(1, sizeof *i);
    i->fabric_attr = calloc(1, sizeof *i->fabric_attr);
    i->fabric_attr->prov_name = strdup("efa");
    *info = i;
    return 0;
}
void fi_freeinfo(struct fi_info *i) {
    free(i->fabric_attr->prov_name);
    free(i->fabric_attr);
    free(i);
}
C
cc -shared -fPIC -o "$root/opt/amazon/efa/lib64/libfabric.so.1" "$tmp/fabric_stub.c" || fail "cannot build the libfabric stub"
echo 'int ncclNet_v8[64];' > "$tmp/plugin_stub.c"
plugin_dir=$root/opt/amazon/ofi-nccl/lib
mkdir -p "$plugin_dir"
cc -shared -fPIC -o "$tmp/libnccl-net-ofi.so" "$tmp/plugin_stub.c" || fail "cannot build the plugin stub"
device() { # NAME DRIVER [PORT_STATE]
    mkdir -p "$root/sys/class/infiniband/$1/device" "$root/sys/class/infiniband/$1/ports/1"
    ln -sfn "$root/drivers/$2" "$root/sys/class/infiniband/$1/device/driver"
    [ -z "${3:-}" ] || echo "$3" > "$root/sys/class/infiniband/$1/ports/1/state"
}
probe() { env -u NCCL_NET_PLUGIN -u FI_PROVIDER FSDP_FAULTS="fabric_root=$root" "$@"; }

# EFA without a plugin: refused, unless fabric.require is off
device rdmap0s31 efa
expect_status 1 "EFA is present (rdmap0s31) but no NCCL net plugin loads" probe "$fsdpctl" fabric
expect_status 0 "fabric: efa" probe "$fsdpctl" fabric --no-require

# EFA with aws-ofi-nccl: the plugin and libfabric's settings
cp "$tmp/libnccl-net-ofi.so" "$plugin_dir/"
out=$(probe "$fsdpctl" fabric 2>&1) || { echo "$out"; fail "EFA with its plugin was refused"; }
echo "$out"
for want in "fabric: efa (EFA devices: rdmap0s31;" "libfabric: $root/opt/amazon/efa/lib64/libfabric.so.1 (efa provider)" \
            "NCCL net plugin: $plugin_dir/libnccl-net-ofi.so" "fabric: NCCL_NET_PLUGIN=ofi" "fabric: FI_PROVIDER=efa" \
            "fabric: FI_EFA_USE_DEVICE_RDMA=1" "fabric: FI_EFA_FORK_SAFE=1" \
            "fabric: LD_LIBRARY_PATH starts with $plugin_dir (for $plugin_dir/libnccl-net-ofi.so)" \
            "fabric: LD_LIBRARY_PATH starts with $root/opt/amazon/efa/lib64 (for $root/opt/amazon/efa/lib64/libfabric.so.1)"; do
    grep -qF "$want" <<<"$out" || fail "EFA with its plugin: no '$want'"
done
# libfabric's directory, then the plugin's, before what LD_LIBRARY_PATH held
out=$(LD_LIBRARY_PATH=/usr/lib/extra probe "$fsdpctl" fabric 2>&1) || { echo "$out"; fail "EFA with its plugin was refused"; }
grep -qxF "workers' LD_LIBRARY_PATH=$root/opt/amazon/efa/lib64:$plugin_dir:/usr/lib/extra" <<<"$out" ||
    { echo "$out"; fail "the workers' LD_LIBRARY_PATH lacks libfabric's or the plugin's directory"; }
# what the user set is kept
out=$(FSDP_FAULTS="fabric_root=$root" FI_PROVIDER=tcp env -u NCCL_NET_PLUGIN "$fsdpctl" fabric 2>&1) || fail "a user's FI_PROVIDER made it fail"
! grep -q "FI_PROVIDER=efa" <<<"$out" || fail "the user's FI_PROVIDER was overridden"

# InfiniBand only (no EFA device, a libfabric without the efa provider)
rm -rf "$root/sys/class/infiniband/rdmap0s31" "$root/opt/amazon/efa"
device mlx5_0 mlx5_core "4: ACTIVE"
out=$(probe "$fsdpctl" fabric 2>&1) || fail "InfiniBand was refused"
grep -q "fabric: ib (EFA devices: none; InfiniBand/RoCE devices: mlx5_0(ACTIVE)" <<<"$out" || { echo "$out"; fail "mlx5_0 not found"; }
! grep -q "FI_PROVIDER" <<<"$out" || fail "FI_PROVIDER set without EFA"
echo "fabric probe: this machine none; fake EFA refused without a plugin, set up with one; fake InfiniBand found"

# --- the network check across two hosts ------------------------------------------------------
netns_available || skip_test "$NETNS_WHY (the probe cases above passed)"
make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
netns_up 2
node() { # I JOB ARGS...
    local i=$1 job=$2
    shift 2
    netns_spawn "$i" "$tmp/$job-n$i.log" env SLURM_JOB_ID="$job" SLURM_NNODES=2 SLURM_NODEID="$i" \
        SLURM_JOB_NODELIST="n[0-1]" SLURMD_NODENAME="n$i" "$fsdpd" --job "$tmp/job.json" --runtime.workers_per_node=1 \
        --checkpoint.save_final=false --output.consolidate=false --runtime.join_timeout_s=20 --train.micro_batch=1 \
        --checkpoint.dir="$tmp/$job.ckpt" --output.dir="$tmp/$job.out" "$@"
}
node 0 pf; a=$NETNS_PID; node 1 pf; b=$NETNS_PID
wait "$a" || { cat "$tmp/pf-n0.log"; fail "pf: the leader failed"; }
wait "$b" || { cat "$tmp/pf-n1.log"; fail "pf: the follower failed"; }
for i in 0 1; do
    grep -Eq "rank $i: network check: [0-9.]+ GB/s of bus bandwidth \(all_reduce over 2 ranks\), transport tcp" "$tmp/pf-n$i.log" ||
        { cat "$tmp/pf-n$i.log"; fail "pf: no network check logged for rank $i"; }
done
grep -h "network check" "$tmp"/pf-n*.log
node 0 hi --fabric.min_busbw_gbps=1e9; a=$NETNS_PID; node 1 hi --fabric.min_busbw_gbps=1e9; b=$NETNS_PID
sa=0; wait "$a" || sa=$?
sb=0; wait "$b" || sb=$?
[ "$sa" -ne 0 ] && [ "$sb" -ne 0 ] || fail "hi: an impossible bandwidth floor did not stop the job ($sa, $sb)"
grep -q "the network check measured [0-9.]* GB/s of bus bandwidth, below fabric.min_busbw_gbps = 1e+09" "$tmp/hi-n0.log" ||
    { cat "$tmp/hi-n0.log"; fail "hi: the leader did not name the floor"; }
! grep -q "step 1/" "$tmp/hi-n0.log" || fail "hi: the job trained below the floor"
echo "network check: logged per rank; a floor of 1e9 GB/s stopped the job before training"
