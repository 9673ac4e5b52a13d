# shellcheck shell=bash
# A real SLURM (Debian 12: 22.05) of two compute nodes on this one machine, for the SLURM
# integration tests (sourced AFTER tests/integration/lib.sh and netns.sh).
#
#   slurm_available || skip_test "$SLURM_WHY"
#   slurm_cluster_up                      # munged, slurmctld on n0, slurmd n1 and n2
#   slurm_cmd sbatch --parsable ...       # a client command on the submitting host n0
#   slurm_wait_end JOBID 120             # prints COMPLETED, FAILED, TIMEOUT...
#   slurm_cluster_down                    # also on EXIT
#
# The hosts are netns.sh's network namespaces: n0 is the controller and the submitting host,
# n1 and n2 the compute nodes.  Each daemon enters its host with `nsenter --net` (not `ip
# netns exec`, which remounts /sys: slurmd would find no cgroup filesystem) in a mount
# namespace of its own where the host's /etc/hosts is bound over /etc/hosts and an empty
# tmpfs over $SLURM_NODE_TMP: a node-local temporary directory, as on a real cluster (a job
# given TMPDIR=$SLURM_NODE_TMP has its status socket on its node only).  Everything else
# (the test's $tmp, the checkpoint directories) is shared by every host.
#
# Settings that matter (observed on 22.05):
#   TmpFS=DIR/%n per node        else `srun --mpi=pmix` fails: the nodes' PMIx servers meet
#                                in one shared /tmp
#   AuthInfo=cred_expire=10      a requeued job waits for the last run's credential to
#                                expire (120 s by default) before it starts again
#   JobRequeue=1, KillWait=5, bf_interval=1, PreemptType=preempt/partition_prio with
#   PreemptMode=REQUEUE: partition "high" preempts "low", whose GraceTime is
#   $SLURM_GRACE_S: its steps get SIGCONT + SIGTERM, SIGKILL after the grace.
# Process tracking is proctrack/linuxproc (no cgroups needed in a CI container); the daemons
# run as root, as do the jobs.
#
# Set by slurm_cluster_up: SLURM_DIR (config, state, logs), SLURM_CONF (exported for the
# clients), SLURM_NODE_TMP, SLURM_PIDS (the daemons).

SLURM_WHY=""
SLURM_DIR=""
SLURM_NODE_TMP=""
SLURM_GRACE_S=${SLURM_GRACE_S:-30}
SLURM_PIDS=()
SLURM_MUNGED_PID=""
SLURM_ENTER=()

# slurm_available: 0 when a cluster can be started here; otherwise 1, why in $SLURM_WHY.
slurm_available() {
    local tool
    for tool in slurmctld slurmd slurmstepd munged sbatch srun scontrol squeue nsenter unshare; do
        command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
            { SLURM_WHY="no '$tool' command (scripts/install-deps.sh installs SLURM and munge)"; return 1; }
    done
    [ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] ||
        { SLURM_WHY="no SLURM PMIx plugin (slurm-wlm-basic-plugins, libpmix-dev)"; return 1; }
    netns_available || { SLURM_WHY="$NETNS_WHY"; return 1; }
}

# The command that enters host I (a mount namespace of its own: its /etc/hosts and its
# node-local tmpfs); CMD... goes after it.
SLURM_ENTER_SH='hostname "$2" && mount --bind "/etc/netns/$1/hosts" /etc/hosts && mkdir -p "$3" &&
mount -t tmpfs fsdp-node-tmp "$3" || exit 1
shift 3
exec "$@"'
slurm_enter_argv() {
    local ns
    ns=$(netns_ns "$1") || exit 1
    SLURM_ENTER=(nsenter "--net=/run/netns/$ns" unshare --uts --mount --propagation private
                 bash -c "$SLURM_ENTER_SH" slurm-host "$ns" "${NETNS_HOSTS[$1]}" "$SLURM_NODE_TMP")
}

# slurm_cmd CMD...: runs a client command on the submitting host n0.
slurm_cmd() {
    slurm_enter_argv 0
    "${SLURM_ENTER[@]}" "$@"
}

# slurm_daemon I LOG CMD...: a daemon in host I, in the background (pid in SLURM_PIDS).
slurm_daemon() {
    slurm_enter_argv "$1"
    "${SLURM_ENTER[@]}" "${@:3}" < /dev/null > "$2" 2>&1 &
    SLURM_PIDS+=("$!")
    bg_pids+=("$!")
}

slurm_write_conf() {
    local d=$SLURM_DIR
    cat > "$SLURM_CONF" <<CONF
ClusterName=fsdptest
SlurmctldHost=${NETNS_HOSTS[0]}(${NETNS_ADDRS[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.socket,cred_expire=10
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$d/tmpfs/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=${NETNS_HOSTS[1]} NodeAddr=${NETNS_ADDRS[1]} CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=${NETNS_HOSTS[2]} NodeAddr=${NETNS_ADDRS[2]} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=low Nodes=${NETNS_HOSTS[1]},${NETNS_HOSTS[2]} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$SLURM_GRACE_S OverSubscribe=NO
PartitionName=high Nodes=${NETNS_HOSTS[1]},${NETNS_HOSTS[2]} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF OverSubscribe=NO
CONF
}

slurm_start_munge() {
    local d=$SLURM_DIR/munge
    mkdir -p "$d"
    chmod 0700 "$d"
    dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$d/munge.key"
    munged --force --socket="$d/munge.socket" --key-file="$d/munge.key" --pid-file="$d/munged.pid" \
        --log-file="$d/munged.log" --seed-file="$d/munged.seed" ||
        fail "slurm: munged did not start: $(tail -3 "$d/munged.log" 2>/dev/null)"
    SLURM_MUNGED_PID=$(cat "$d/munged.pid")
}

# slurm_cluster_up: the whole cluster, both nodes idle.
slurm_cluster_up() {
    netns_up 3
    SLURM_DIR="$tmp/slurm"
    SLURM_NODE_TMP="$SLURM_DIR/node-tmp"
    export SLURM_CONF="$SLURM_DIR/etc/slurm.conf"
    mkdir -p "$SLURM_DIR"/{etc,state,spool,run,log,tmpfs} "$SLURM_NODE_TMP"
    local h
    for h in "${NETNS_HOSTS[1]}" "${NETNS_HOSTS[2]}"; do mkdir -p "$SLURM_DIR/tmpfs/$h" "$SLURM_DIR/spool/$h"; done
    # The mount point vanished twice from under running tests on a shared machine (an empty
    # directory in /tmp: a sweep of empty directories, most likely; the hosts' tmpfs hides
    # what is under it): a file keeps it from being empty, and entering a host recreates it.
    touch "$SLURM_NODE_TMP/.mount-point"
    slurm_write_conf
    slurm_start_munge
    slurm_daemon 0 "$SLURM_DIR/log/slurmctld.out" slurmctld -D -i -f "$SLURM_CONF"
    slurm_daemon 1 "$SLURM_DIR/log/slurmd-n1.out" slurmd -D -N "${NETNS_HOSTS[1]}" -f "$SLURM_CONF"
    slurm_daemon 2 "$SLURM_DIR/log/slurmd-n2.out" slurmd -D -N "${NETNS_HOSTS[2]}" -f "$SLURM_CONF"
    local i
    for ((i = 0; i < 300; i++)); do
        [ "$(slurm_cmd sinfo -h -N -p low -o '%T' 2>/dev/null | grep -cx idle)" -eq 2 ] && return 0
        sleep 0.1
    done
    slurm_dump_logs
    slurm_cmd sinfo -N >&2 || true
    fail "slurm: the two nodes are not idle after 30 s"
}

slurm_dump_logs() {
    local f
    for f in "$SLURM_DIR"/log/*; do echo "--- $f"; tail -n 30 "$f"; done >&2
}

# slurm_job_state JOBID: the job's state (PENDING, RUNNING, COMPLETED, ...).
slurm_job_state() { slurm_cmd scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# slurm_job_field JOBID FIELD: one Key=value of `scontrol show job` (Restarts, ExitCode...).
slurm_job_field() { slurm_cmd scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# slurm_wait_state JOBID STATE SECONDS: waits for the job to reach STATE (fails on timeout).
slurm_wait_state() {
    local end=$((SECONDS + $3)) state
    while [ "$SECONDS" -lt "$end" ]; do
        state=$(slurm_job_state "$1")
        [ "$state" = "$2" ] && return 0
        sleep 0.5
    done
    slurm_cmd scontrol show job "$1" >&2 || true
    fail "slurm: job $1 is $state after $3 s, expected $2"
}

# slurm_wait_end JOBID SECONDS: waits for the job to end (a state after which it never runs
# again: COMPLETED, FAILED, TIMEOUT, CANCELLED, ...) and prints that state.
slurm_wait_end() {
    local end=$((SECONDS + $2)) state
    while [ "$SECONDS" -lt "$end" ]; do
        state=$(slurm_job_state "$1")
        case "$state" in
        ""|PENDING|RUNNING|REQUEUED|REQUEUE_FED|REQUEUE_HOLD|COMPLETING|CONFIGURING|SUSPENDED|PREEMPTED|RESIZING|SIGNALING|STAGE_OUT) ;;
        *) echo "$state"; return 0 ;;
        esac
        sleep 0.5
    done
    slurm_cmd scontrol show job "$1" >&2 || true
    slurm_cmd scontrol show nodes >&2 || true # a job left pending: the nodes' states and
    slurm_dump_logs                           # the daemons' logs say why
    fail "slurm: job $1 is still $state after $2 s"
}

# slurm_cluster_down: cancels what runs, shuts slurmctld and the slurmds down
# (`scontrol shutdown`), then munged, then the hosts.  Safe to call twice.
slurm_cluster_down() {
    [ -n "$SLURM_DIR" ] || return 0
    if [ "${#SLURM_PIDS[@]}" -gt 0 ]; then
        slurm_cmd scancel --full --quiet --user=root 2>/dev/null || true
        slurm_cmd scontrol shutdown 2>/dev/null || true
        local p i
        for p in "${SLURM_PIDS[@]}"; do
            for ((i = 0; i < 100 && $(kill -0 "$p" 2>/dev/null && echo 1 || echo 0); i++)); do sleep 0.1; done
            kill -9 "$p" 2>/dev/null || true
        done
        SLURM_PIDS=()
    fi
    if [ -n "$SLURM_MUNGED_PID" ]; then
        kill "$SLURM_MUNGED_PID" 2>/dev/null || true
        SLURM_MUNGED_PID=""
    fi
    netns_down
    SLURM_DIR=""
}

slurm_previous_exit_trap=$(trap -p EXIT)
if [ -n "$slurm_previous_exit_trap" ]; then
    eval "slurm_previous_exit_trap=$(printf '%s' "$slurm_previous_exit_trap" | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
fi
slurm_on_exit() {
    slurm_cluster_down || true
    eval "$slurm_previous_exit_trap" || true
}
trap slurm_on_exit EXIT
