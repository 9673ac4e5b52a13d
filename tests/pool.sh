# shellcheck shell=bash
# A pool of background commands, each with its own log and exit status, for tests/run.sh and
# tests/run_fuzz.sh (sourced).
#
#   pool_init DIR          # logs and statuses go to DIR (made by the caller)
#   pool_start ID CMD...   # CMD in the background, stdout and stderr in DIR/ID.log
#   pool_size              # prints how many started commands are not collected yet
#   pool_next              # waits for one of them to end; sets POOL_ID, POOL_RC, POOL_SECONDS
#
# pool_next polls for each command's status file instead of using `wait -n`: `wait -n` never
# reports a command that ended before it was called, and two that end together would then
# leave a slot idle until a third ends.

POOL_DIR=""
declare -A POOL_PIDS=()
POOL_ID="" POOL_RC="" POOL_SECONDS=""

pool_init() { POOL_DIR=$1; POOL_PIDS=(); }

pool_start() {
    local id=$1
    shift
    (
        start=$SECONDS
        "$@" > "$POOL_DIR/$id.log" 2>&1
        rc=$?
        echo "$rc $((SECONDS - start))" > "$POOL_DIR/$id.status.tmp" && mv "$POOL_DIR/$id.status.tmp" "$POOL_DIR/$id.status"
    ) &
    POOL_PIDS[$id]=$!
}

pool_size() { echo "${#POOL_PIDS[@]}"; }

# pool_next: a command that died without writing its status (killed) ends with status 1, its
# log saying so.
pool_next() {
    local id
    [ "${#POOL_PIDS[@]}" -gt 0 ] || { echo "pool_next: nothing running" >&2; return 1; }
    while :; do
        for id in "${!POOL_PIDS[@]}"; do
            [ -e "$POOL_DIR/$id.status" ] || ! kill -0 "${POOL_PIDS[$id]}" 2>/dev/null || continue
            wait "${POOL_PIDS[$id]}" 2>/dev/null
            unset 'POOL_PIDS[$id]'
            POOL_ID=$id POOL_RC=1 POOL_SECONDS=0
            if [ -e "$POOL_DIR/$id.status" ]; then
                read -r POOL_RC POOL_SECONDS < "$POOL_DIR/$id.status"
            else
                echo "(killed before it could report its exit status)" >> "$POOL_DIR/$id.log"
            fi
            return 0
        done
        sleep 0.1
    done
}
