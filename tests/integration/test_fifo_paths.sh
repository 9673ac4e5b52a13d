#!/usr/bin/env bash
# A FIFO wherever fsdpd or fsdpctl is given a file to read or append (F37): data.path (a
# token cache), runtime.metrics, a shard file under `latest`, and `fsdpctl consolidate` of that
# checkpoint are each refused at once, naming the path and saying it is a FIFO, where they
# used to block in open() (fsdpd's signals ignored meanwhile) until SIGKILL.
source "$(dirname "$0")/lib.sh"

make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
mkfifo "$tmp/fifo"

# refused NAME FIFO CMD...: CMD fails within 20 s (timeout's 124 is a hang) naming FIFO as one.
refused() {
    local name=$1 fifo=$2 status=0
    shift 2
    timeout -k 5 20 "$@" > "$tmp/$name.log" 2>&1 || status=$?
    [ "$status" -ne 124 ] && [ "$status" -ne 137 ] || fail "$name: still blocked after 20 s"
    [ "$status" -ne 0 ] || { cat "$tmp/$name.log"; fail "$name: exited 0"; }
    grep -qF "$fifo: is a FIFO, not a regular file" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: $fifo is not named"; }
    echo "$name: $fifo refused"
}

refused data "$tmp/fifo" "$fsdpd" --job "$tmp/job.json" --data.path="$tmp/fifo"
refused metrics "$tmp/fifo" "$fsdpd" --job "$tmp/job.json" --runtime.metrics="$tmp/fifo"

"$fsdpd" --job "$tmp/job.json" --checkpoint.interval_steps=2 --output.consolidate=false > "$tmp/first.log" 2>&1 ||
    { cat "$tmp/first.log"; fail "the first run failed"; }
shard=$tmp/ckpt/step-000004/rank-00001-of-00002.bin
[ -f "$shard" ] || fail "no shard file $shard"
rm "$shard"
mkfifo "$shard"
refused resume "$shard" "$fsdpd" --job "$tmp/job.json" --checkpoint.resume=auto
refused consolidate "$shard" "$fsdpctl" consolidate "$tmp/ckpt" "$tmp/merged"
echo "fifo paths: ok"
