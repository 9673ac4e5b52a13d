# shellcheck shell=bash
# Several "hosts" on this one machine, for multi-node integration tests (sourced AFTER lib.sh).
# Each host is a network namespace with its own loopback and one interface, eth0, cabled by a
# veth pair to a bridge that lives in one more namespace (the "switch"); the root namespace's
# network is never touched.  The hosts share everything else: the filesystem (/tmp, /dev/shm),
# pathname Unix sockets and PIDs.  127.0.0.1 and abstract Unix sockets are per host, so a
# daemon that falls back to localhost, or to an abstract socket, fails to reach its peers here
# as it would on a real cluster.
#
#   netns_available || skip_test "$NETNS_WHY"
#   netns_up 3                        # hosts 0..2, named n0 n1 n2
#   netns_spawn 0 "$tmp/n0.log" "$fsdpd" ...; leader=$NETNS_PID
#   netns_exec 1 getent hosts n0      # -> ${NETNS_ADDRS[0]}
#   netns_exec_private_dir 2 "$tmp/shared" cmd...   # host 2 without the shared directory
# A command run in host i also has hostname n<i> (its own UTS namespace).
#
# Set by netns_up (shell variables; arrays cannot cross into a child's environment):
#   NETNS_NAMES[i]  the namespace of host i ("fsdp<pid>h<i>"); NETNS_SWITCH the switch's
#   NETNS_HOSTS[i]  its host name, n<i>, resolvable in every host (/etc/netns/<ns>/hosts,
#                   which `ip netns exec` bind-mounts over /etc/hosts)
#   NETNS_ADDRS[i]  its address, 10.213.<$$ % 256>.<i+1>; NETNS_SUBNET that /24 ("10.213.X.0/24")
# Set by netns_spawn*: NETNS_PID, the command's pid (also appended to lib.sh's bg_pids).
# netns_down removes all of it (and kills what still runs in the hosts); it runs on EXIT too,
# after whatever EXIT trap was set before this file was sourced (lib.sh's cleanup).  What a
# test killed by SIGKILL leaves is removed by the next netns_up (netns_sweep_stale).

NETNS_PREFIX="fsdp$$"
NETNS_NAMES=()
NETNS_HOSTS=()
NETNS_ADDRS=()
NETNS_SWITCH=""
NETNS_SUBNET="10.213.$(($$ % 256)).0/24"
NETNS_PID=""
NETNS_ENTER=()
NETNS_WHY=""
NETNS_MADE_ETC=""   # netns_up made /etc/netns, so netns_down removes it once it is empty

# netns_available: 0 when namespaces, veth pairs and bridges can be made here (tried on a
# throw-away namespace); otherwise 1 with the reason in $NETNS_WHY.
netns_available() {
    local probe="${NETNS_PREFIX}probe" tool
    if [ "$(id -u)" -ne 0 ]; then NETNS_WHY="network namespaces need root"; return 1; fi
    for tool in ip unshare mount; do
        command -v "$tool" >/dev/null || { NETNS_WHY="no '$tool' command"; return 1; }
    done
    if ! ip netns add "$probe" 2>/dev/null; then
        NETNS_WHY="'ip netns add' does not work here"; return 1
    fi
    if ! ip -n "$probe" link add br0 type bridge 2>/dev/null ||
       ! ip -n "$probe" link add v0 type veth peer name v1 2>/dev/null; then
        NETNS_WHY="no bridge or veth support in network namespaces"
        ip netns del "$probe" 2>/dev/null || true
        return 1
    fi
    ip netns del "$probe"
}

# netns_sweep_stale: removes what a test killed before its EXIT trap ran (SIGKILL) left:
# namespaces named as netns_up names them whose maker (the pid in the name) is gone and in
# which nothing runs, and their /etc/netns entries.  Nothing is killed.
netns_sweep_stale() {
    local ns pid
    while read -r ns _; do
        [[ "$ns" =~ ^fsdp([0-9]+)(sw|h[0-9]+)$ ]] || continue
        pid=${BASH_REMATCH[1]}
        [ ! -d "/proc/$pid" ] && [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] || continue
        ip netns del "$ns" 2>/dev/null && rm -rf "/etc/netns/$ns"
    done < <(ip netns list)
}

# netns_up N: makes hosts 0..N-1 (1 <= N <= 16) and the switch between them.
netns_up() {
    local n=${1:-} i
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 16 ] ||
        fail "netns_up: host count must be 1..16, got '$n'"
    [ -z "$NETNS_SWITCH" ] || fail "netns_up: hosts are already up (${NETNS_NAMES[*]})"
    netns_sweep_stale
    [ -d /etc/netns ] || NETNS_MADE_ETC=1
    # Each name is recorded as soon as its namespace is made (never before: a name that was
    # taken is not ours to remove), so a failure half-way is still cleaned up.
    ip netns add "${NETNS_PREFIX}sw" || fail "netns_up: cannot add namespace ${NETNS_PREFIX}sw"
    NETNS_SWITCH="${NETNS_PREFIX}sw"
    ip -n "$NETNS_SWITCH" link set lo up
    ip -n "$NETNS_SWITCH" link add br0 type bridge forward_delay 0
    ip -n "$NETNS_SWITCH" link set br0 up
    for ((i = 0; i < n; i++)); do netns_add_host "$i"; done
    for ((i = 0; i < n; i++)); do netns_write_hosts "$i"; done
}

# netns_add_host I: host I's namespace, its eth0 with its address, cabled to the switch's
# port h<I> (interface names are per namespace, so these short names never clash).
netns_add_host() {
    local ns="${NETNS_PREFIX}h$1"
    ip netns add "$ns" || fail "netns_up: cannot add namespace $ns"
    NETNS_NAMES+=("$ns")
    NETNS_HOSTS+=("n$1")
    NETNS_ADDRS+=("${NETNS_SUBNET%.0/24}.$(($1 + 1))")
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 type veth peer name "h$1" netns "$NETNS_SWITCH"
    ip -n "$NETNS_SWITCH" link set "h$1" master br0
    ip -n "$NETNS_SWITCH" link set "h$1" up
    ip -n "$ns" addr add "${NETNS_ADDRS[$1]}/24" dev eth0
    ip -n "$ns" link set eth0 up
}

# netns_write_hosts I: host I's /etc/hosts, naming every host.
netns_write_hosts() {
    local dir=/etc/netns/${NETNS_NAMES[$1]} i
    mkdir -p "$dir"
    {
        printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n'
        for i in "${!NETNS_HOSTS[@]}"; do printf '%s\t%s\n' "${NETNS_ADDRS[$i]}" "${NETNS_HOSTS[$i]}"; done
    } > "$dir/hosts"
}

# netns_ns I: the namespace of host I (fails on an index that is not a host).
netns_ns() {
    [[ "${1:-}" =~ ^[0-9]+$ ]] && [ "$1" -lt "${#NETNS_NAMES[@]}" ] ||
        fail "netns: no host '${1:-}' (hosts: 0..$((${#NETNS_NAMES[@]} - 1)))"
    echo "${NETNS_NAMES[$1]}"
}

# Inside a host, a command also gets its own UTS namespace with the host's name, so that
# gethostname() says n<i> as it would on node i, and its own mount namespace; with a DIR
# (the private-directory variants) an empty tmpfs is mounted over DIR there, so that host does
# not see the shared directory (nor its files, nor its pathname sockets): what it writes
# there stays its own and goes away with it.  Every step execs, so the pid is CMD's own.
# bash, not sh: dash would drop environment entries it cannot name (exported functions).
NETNS_ENTER_SH='hostname "$1" || exit 1
[ -z "$2" ] || mount -t tmpfs fsdp-private "$2" || exit 1
shift 2
exec "$@"'

# netns_enter_argv I DIR: sets NETNS_ENTER to the command line that enters host I (DIR empty:
# with the shared filesystem); CMD... goes after it.
netns_enter_argv() {
    local ns
    ns=$(netns_ns "$1") || exit 1
    NETNS_ENTER=(ip netns exec "$ns" unshare --uts --mount --propagation private
                 bash -c "$NETNS_ENTER_SH" netns-host "${NETNS_HOSTS[$1]}" "$2")
}

# netns_run I DIR CMD...: runs CMD in host I, in the foreground.
netns_run() {
    netns_enter_argv "$1" "$2"
    "${NETNS_ENTER[@]}" "${@:3}"
}

# netns_run_bg I DIR LOG CMD...: runs CMD in host I in the background, stdout and stderr to
# LOG; the pid is $NETNS_PID (CMD's own: `&` on a simple command forks once and everything
# after execs), and in bg_pids (lib.sh's cleanup kills it).
netns_run_bg() {
    netns_enter_argv "$1" "$2"
    "${NETNS_ENTER[@]}" "${@:4}" < /dev/null > "$3" 2>&1 &
    NETNS_PID=$!
    bg_pids+=("$NETNS_PID")
}

# netns_private_dir FUNCTION DIR: fails unless DIR is a directory to hide.
netns_private_dir() {
    [ -n "$2" ] && [ -d "$2" ] || fail "$1: '$2' is not a directory"
}

# netns_exec I CMD...: runs CMD in host I, in the foreground.
netns_exec() { netns_run "$1" "" "${@:2}"; }
# netns_spawn I LOG CMD...: runs CMD in host I in the background (pid in $NETNS_PID).
netns_spawn() { netns_run_bg "$1" "" "$2" "${@:3}"; }
# netns_exec_private_dir I DIR CMD...: netns_exec, with an empty private DIR.
netns_exec_private_dir() { netns_private_dir "${FUNCNAME[0]}" "$2"; netns_run "$1" "$2" "${@:3}"; }
# netns_spawn_private_dir I DIR LOG CMD...: netns_spawn, with an empty private DIR.
netns_spawn_private_dir() { netns_private_dir "${FUNCNAME[0]}" "$2"; netns_run_bg "$1" "$2" "$3" "${@:4}"; }

# The multi-node tests' helpers (a job JOB checkpoints in $tmp/JOB.ckpt):
# nothing_left NAME: no process runs in any host (every daemon and worker is gone), and no
# shared memory of fsdpd's is left in /dev/shm.
nothing_left() {
    local ns left
    for ns in "${NETNS_NAMES[@]}"; do
        left=$(ip netns pids "$ns" | tr '\n' ' ')
        [ -z "$left" ] || { ps -o pid,stat,cmd -p ${left// /,} || true; fail "$1: processes left in $ns: $left"; }
    done
    [ -z "$(ls /dev/shm | grep fsdp)" ] || fail "$1: shared memory left in /dev/shm: $(ls /dev/shm | grep fsdp)"
}
# latest_step JOB: the step its checkpoint directory's `latest` names ("" none); has_latest JOB.
latest_step() { readlink "$tmp/$1.ckpt/latest" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p'; }
has_latest() { [ -n "$(latest_step "$1")" ]; }

# netns_down: kills what still runs in the hosts, removes their namespaces, the switch and
# /etc/netns/<ns>.  Safe to call twice.
netns_down() {
    local ns pids
    for ns in "${NETNS_NAMES[@]+"${NETNS_NAMES[@]}"}" ${NETNS_SWITCH:+"$NETNS_SWITCH"}; do
        if ip netns list | awk '{print $1}' | grep -qxF -- "$ns"; then
            # a namespace outlives `ip netns del` while a process is still in it
            mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
            [ "${#pids[@]}" -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
            ip netns del "$ns" || echo "netns_down: cannot remove namespace $ns" >&2
        fi
        rm -rf "/etc/netns/$ns"
    done
    [ -z "$NETNS_MADE_ETC" ] || rmdir --ignore-fail-on-non-empty /etc/netns 2>/dev/null || true
    NETNS_NAMES=() NETNS_HOSTS=() NETNS_ADDRS=() NETNS_SWITCH=""
}

# Chain onto the EXIT trap already set (lib.sh's cleanup): it runs first (it kills bg_pids),
# then netns_down.
netns_previous_exit_trap=$(trap -p EXIT)
if [ -n "$netns_previous_exit_trap" ]; then
    eval "netns_previous_exit_trap=$(printf '%s' "$netns_previous_exit_trap" | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
fi
netns_on_exit() {
    eval "$netns_previous_exit_trap" || true
    netns_down
}
trap netns_on_exit EXIT
