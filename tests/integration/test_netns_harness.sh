#!/usr/bin/env bash
# netns.sh, the multi-host harness: hosts reach each other by address and by name, 127.0.0.1
# is per host, each host has its own host name, the private-directory helpers hide the shared directory, the root namespace's
# network is left alone, and netns_down (run on EXIT too, even after a failure) removes it all.
source "$(dirname "$0")/lib.sh"
source tests/integration/netns.sh
netns_available || skip_test "$NETNS_WHY"

port=4711
# A TCP server on 0.0.0.0:$port: answers "hello from HOST" to each connection; touches READY
# once it listens.
serve() { # HOST READY
    python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(8)
open(sys.argv[3], "w").close()
while True:
    c, _ = s.accept()
    c.sendall(("hello from " + sys.argv[2]).encode())
    c.close()
' "$port" "$1" "$2"
}
# ask HOST: what the server at HOST:$port says; exits 1 (saying why) when it cannot connect.
ask() {
    python3 -c '
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
except OSError as e:
    sys.exit("cannot connect to %s: %s" % (sys.argv[1], e))
print(s.recv(64).decode())
' "$1" "$port"
}
export -f serve ask
export port
# stopped PID: assert_gone's test, as a condition for wait_for.
stopped() { (assert_gone "$1") 2>/dev/null; }

# a namespace left by a test killed before its cleanup (its maker's pid is gone), with an
# /etc/netns entry: netns_up sweeps it away
true & dead=$!; wait "$dead"
stale="fsdp${dead}h0"
ip netns add "$stale" && mkdir -p "/etc/netns/$stale"
root_links_before=$(ip -o link show | awk '{print $2}')
netns_up 3
swept=0; ip netns list | awk '{print $1}' | grep -qxF -- "$stale" || swept=1
[ -e "/etc/netns/$stale" ] && swept=0
[ "$swept" -eq 1 ] || { ip netns del "$stale" 2>/dev/null; rm -rf "/etc/netns/$stale"; fail "netns_up left the stale namespace $stale"; }
[ "${#NETNS_NAMES[@]}" -eq 3 ] && [ "${#NETNS_HOSTS[@]}" -eq 3 ] && [ "${#NETNS_ADDRS[@]}" -eq 3 ] ||
    fail "netns_up 3 made ${#NETNS_NAMES[@]} namespaces, ${#NETNS_HOSTS[@]} names, ${#NETNS_ADDRS[@]} addresses"
[ "$(ip -o link show | awk '{print $2}')" = "$root_links_before" ] ||
    fail "netns_up changed the root namespace's interfaces"

# --- names: every host resolves every host, and localhost
for i in 0 1 2; do
    for j in 0 1 2; do
        got=$(netns_exec "$i" getent hosts "${NETNS_HOSTS[$j]}" | awk '{print $1}') || got=""
        [ "$got" = "${NETNS_ADDRS[$j]}" ] ||
            fail "in host $i, ${NETNS_HOSTS[$j]} resolves to '$got', not ${NETNS_ADDRS[$j]}"
    done
done
for i in 0 1 2; do
    got=$(netns_exec "$i" hostname) || got=""
    [ "$got" = "${NETNS_HOSTS[$i]}" ] || fail "host $i calls itself '$got', not ${NETNS_HOSTS[$i]}"
done
netns_exec 1 getent hosts localhost | grep -q '^127\.0\.0\.1\|^::1' || fail "localhost does not resolve in host 1"

# --- TCP across hosts, and 127.0.0.1 per host
netns_spawn 0 "$tmp/server.log" bash -c 'serve n0 "$1"' serve "$tmp/ready"
server=$NETNS_PID
wait_for 5 test -f "$tmp/ready"
[ "$(netns_exec 1 bash -c 'ask "$1"' ask "${NETNS_ADDRS[0]}")" = "hello from n0" ] ||
    fail "host 1 did not reach host 0's server at ${NETNS_ADDRS[0]}"
[ "$(netns_exec 2 bash -c 'ask n0')" = "hello from n0" ] || fail "host 2 did not reach host 0's server as n0"
# the server does answer on 127.0.0.1 in its own host ...
[ "$(netns_exec 0 bash -c 'ask 127.0.0.1')" = "hello from n0" ] || fail "host 0 did not reach its own server on 127.0.0.1"
# ... and 127.0.0.1 in another host is that host's own loopback, with nothing listening
if netns_exec 1 bash -c 'ask 127.0.0.1' > "$tmp/loopback.out" 2>&1; then
    fail "127.0.0.1 in host 1 reached host 0's server: $(cat "$tmp/loopback.out")"
fi
grep -q 'refused' "$tmp/loopback.out" || fail "127.0.0.1 in host 1: $(cat "$tmp/loopback.out")"

# --- netns_spawn's pid is the command's own (so tests can wait on it and signal it)
netns_spawn 2 "$tmp/sleep.log" sleep 30
runs_sleep() { [ "$(cat "/proc/$1/comm" 2>/dev/null)" = sleep ]; }   # once the execs are done
wait_for 3 runs_sleep "$NETNS_PID"
kill "$NETNS_PID"
status=0; wait "$NETNS_PID" || status=$?
[ "$status" -eq 143 ] || fail "the spawned sleep exited $status after SIGTERM, not 143"

# --- the shared directory, and a host without it
if (netns_exec_private_dir 1 "" true) 2> "$tmp/nodir.err"; then fail "netns_exec_private_dir ran with no directory"; fi
grep -q "is not a directory" "$tmp/nodir.err" || fail "netns_exec_private_dir with no directory: $(cat "$tmp/nodir.err")"
mkdir "$tmp/shared"
echo here > "$tmp/shared/marker"
netns_exec 1 test -f "$tmp/shared/marker" || fail "host 1 does not see the shared directory"
netns_exec_private_dir 1 "$tmp/shared" sh -c 'test ! -e "$1/marker" && echo mine > "$1/own"' sh "$tmp/shared" ||
    fail "netns_exec_private_dir: host 1 still sees the shared directory's file"
[ ! -e "$tmp/shared/own" ] || fail "a file written in host 1's private directory appeared in the shared one"
netns_spawn_private_dir 2 "$tmp/shared" "$tmp/private.log" sh -c 'ls -A "$1"; echo "files: $(ls -A "$1" | wc -l)"' sh "$tmp/shared"
wait "$NETNS_PID" || fail "netns_spawn_private_dir: the command failed: $(cat "$tmp/private.log")"
grep -qx 'files: 0' "$tmp/private.log" || fail "netns_spawn_private_dir: host 2 sees files: $(cat "$tmp/private.log")"
[ -f "$tmp/shared/marker" ] || fail "the private mount hid the shared file from the test itself"

# --- netns_down removes everything and kills what ran in the hosts
names=("${NETNS_NAMES[@]}" "$NETNS_SWITCH")
gone() { # NAMES...: no namespace of these names, no /etc/netns/<name>
    local n
    for n in "$@"; do
        ! ip netns list | awk '{print $1}' | grep -qxF -- "$n" || { echo "namespace $n is still there"; return 1; }
        [ ! -e "/etc/netns/$n" ] || { echo "/etc/netns/$n is still there"; return 1; }
    done
}
netns_down
why=$(gone "${names[@]}") || fail "after netns_down: $why"
wait_for 3 stopped "$server"
netns_down   # a second call (the EXIT trap's) is harmless

# --- a test that fails half-way still leaves nothing behind (the chained EXIT trap)
status=0
bash -c 'source tests/integration/lib.sh
         source tests/integration/netns.sh
         netns_up 2
         echo "${NETNS_NAMES[*]} $NETNS_SWITCH" > "$1"
         netns_spawn 1 /dev/null sleep 60
         echo "$NETNS_PID" >> "$1"
         fail "deliberate failure"' failing "$tmp/failing" > "$tmp/failing.log" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "the failing test exited $status, not 1: $(cat "$tmp/failing.log")"
read -r -a names < <(head -1 "$tmp/failing")
[ "${#names[@]}" -eq 3 ] || fail "the failing test recorded '${names[*]}'"
why=$(gone "${names[@]}") || fail "after a failing test: $why"
wait_for 3 stopped "$(tail -1 "$tmp/failing")"
# --- a name already taken is refused, and is not removed by the failing test's cleanup
status=0
bash -c 'source tests/integration/lib.sh
         source tests/integration/netns.sh
         echo "${NETNS_PREFIX}sw" > "$1"
         ip netns add "${NETNS_PREFIX}sw"
         netns_up 1' taken "$tmp/taken" > "$tmp/taken.log" 2>&1 || status=$?
taken=$(cat "$tmp/taken")
kept=0; ip netns list | awk '{print $1}' | grep -qxF -- "$taken" || kept=$?
ip netns del "$taken" 2>/dev/null || true
[ "$status" -eq 1 ] && grep -q "cannot add namespace $taken" "$tmp/taken.log" ||
    fail "netns_up over a taken name exited $status: $(cat "$tmp/taken.log")"
[ "$kept" -eq 0 ] || fail "the failing test's cleanup removed namespace $taken, which it had not made"
echo "netns harness: OK"
