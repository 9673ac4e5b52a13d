#!/usr/bin/env bash
# runtime.log_to mlflow (F42), against a real MLflow tracking server (the mlflow package from the
# venv, its SQLite store, on 127.0.0.1 at a free port):
# - a CPU job creates its experiment and a run, logs the resolved job as the run's parameters
#   (every key of job.json) and every step's metrics (each history equal to metrics.jsonl), and
#   marks the run FINISHED; the token of MLFLOW_TRACKING_TOKEN is in no log or output file;
# - the server stopped mid-run (SIGSTOP: it accepts connections and never answers), then,
#   resumed, killed mid-run: each time the job trains to its end and succeeds, the dropped
#   metrics are logged with the reason and counted at the end (no assert on the time: it is
#   reported);
# - a server that cannot serve at the start (a stub answering 503): a warning naming the reason,
#   and the job trains (the stub saw the token as "Authorization: Bearer"); none there at all,
#   with runtime.log_required=true: the job fails at start.
source "$(dirname "$0")/lib.sh"
use_venv mlflow==3.17.2
make_small_model "$tmp"
make_small_data "$tmp/data.tokens"
write_job "$tmp/job.json" "$tmp/model.json" "$tmp/data.tokens"
py=$venv/bin/python
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
uri=http://127.0.0.1:$port
healthy() { "$py" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$uri/health" 2>/dev/null; }
# The server in its own process group (its workers are children): killed as a whole.
setsid "$venv/bin/mlflow" server --backend-store-uri "sqlite:///$tmp/mlflow.db" --default-artifact-root "$tmp/artifacts" \
    --host 127.0.0.1 --port "$port" --workers 1 > "$tmp/server.log" 2>&1 &
server=$!
bg_pids+=("-$server")
wait_for 120 healthy
common=(--runtime.log_to=mlflow --runtime.mlflow_uri="$uri" --data.eval_fraction=0.25 --train.eval_interval=2
        --output.consolidate=false --checkpoint.resume=never)
token=f42-secret-token-$$

# --- a run: experiment, params, metrics, status -----------------------------------------------
MLFLOW_TRACKING_TOKEN=$token "$fsdpd" --job "$tmp/job.json" "${common[@]}" --train.max_steps=6 \
    --runtime.mlflow_experiment=fsdpd-test > "$tmp/a.log" 2>&1 || { cat "$tmp/a.log"; fail "the job logging to MLflow failed"; }
grep -q "mlflow: created experiment 'fsdpd-test'" "$tmp/a.log" || { cat "$tmp/a.log"; fail "the experiment was not created"; }
run=$(sed -n "s/.*mlflow: run \([0-9a-f]*\) ('out') in experiment 'fsdpd-test'.*/\1/p" "$tmp/a.log")
[ -n "$run" ] || { cat "$tmp/a.log"; fail "no run logged"; }
grep -q "mlflow: run $run ended FINISHED: [0-9]* metric values sent, none dropped" "$tmp/a.log" || { cat "$tmp/a.log"; fail "no final count"; }
! grep -rqF "$token" "$tmp/a.log" "$tmp/out" || fail "the token was written somewhere"
"$py" - "$uri" "$run" "$tmp/out/metrics.jsonl" "$tmp/out/job.json" <<'EOF' || fail "the run on the server does not hold the job's params and metrics"
import json, sys, urllib.parse, urllib.request
uri, run, metrics, job = sys.argv[1:]
def get(path, **q):
    return json.load(urllib.request.urlopen(uri + "/api/2.0/mlflow/" + path + "?" + urllib.parse.urlencode(q)))
r = get("runs/get", run_id=run)["run"]
assert r["info"]["status"] == "FINISHED", r["info"]
params = {p["key"]: p["value"] for p in r["data"]["params"]}
want = {f"{s}.{k}": v for s, keys in json.load(open(job)).items() for k, v in keys.items()}
assert sorted(params) == sorted(want), set(params) ^ set(want)
for k, v in want.items():
    assert (params[k] if isinstance(v, str) else json.loads(params[k])) == v, (k, params[k], v)
lines = [json.loads(l) for l in open(metrics)]
assert [l["step"] for l in lines] == list(range(1, 7))
expect = {"train/loss": lambda l: l["loss"], "train/lr": lambda l: l["lr"], "train/grad_norm": lambda l: l["grad_norm"],
          "train/tokens_per_s": lambda l: l["tokens"] / l["seconds"], "memory/bytes": lambda l: float(l["mem_bytes"]),
          "memory/peak_bytes": lambda l: float(l["mem_peak_bytes"]), "eval/loss": lambda l: l["eval_loss"]}
for key, f in expect.items():
    hist = get("metrics/get-history", run_id=run, metric_key=key)["metrics"]
    got = sorted((m["step"], m["value"]) for m in hist)
    exp = [(l["step"], f(l)) for l in lines if key != "eval/loss" or "eval_loss" in l]
    assert got == exp, (key, got, exp)
print("ok: %d params, %d metrics" % (len(params), len(expect)))
EOF

# --- the server stopped mid-run (SIGSTOP: it accepts and never answers), then killed mid-run:
# both times the job goes on ---------------------------------------------------------------------
# step_delay: 30 steps of at least 0.2 s, so that the stop lands mid-run.
FSDP_FAULTS="step_delay=0:0.2" "$fsdpd" --job "$tmp/job.json" "${common[@]}" --train.max_steps=30 \
    --checkpoint.dir="$tmp/s.ckpt" --runtime.metrics="$tmp/s.jsonl" > "$tmp/s.log" 2>&1 &
job=$!
bg_pids+=("$job")
five_steps() { [ -f "$1" ] && [ "$(wc -l < "$1")" -ge 5 ]; }
wait_for 60 five_steps "$tmp/s.jsonl"
kill -STOP -- "-$server"
start=$(date +%s.%N)
status=0
wait "$job" || status=$?
end=$(date +%s.%N)
kill -CONT -- "-$server"
[ "$status" -eq 0 ] || { cat "$tmp/s.log"; fail "the job whose tracking server hung exited $status"; }
[ "$(wc -l < "$tmp/s.jsonl")" -eq 30 ] || { cat "$tmp/s.log"; fail "not every step ran beside the hung server"; }
grep -q "mlflow: metrics dropped (runs/log-batch: .*); training goes on" "$tmp/s.log" || { cat "$tmp/s.log"; fail "the drop beside the hung server is not logged"; }
grep -q "mlflow: run [0-9a-f]* ended FINISHED: [0-9]* metric values sent, [1-9][0-9]* dropped (last: " "$tmp/s.log" ||
    { cat "$tmp/s.log"; fail "the metrics dropped beside the hung server are not counted"; }
echo "server stopped after step 5; the job's remaining 25 steps and its end took $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
wait_for 60 healthy


# step_delay: 30 steps of at least 0.2 s, so that the kill lands mid-run.
start=$(date +%s.%N)
FSDP_FAULTS="step_delay=0:0.2" "$fsdpd" --job "$tmp/job.json" "${common[@]}" --train.max_steps=30 \
    --checkpoint.dir="$tmp/b.ckpt" --runtime.metrics="$tmp/b.jsonl" > "$tmp/b.log" 2>&1 &
job=$!
bg_pids+=("$job")
wait_for 60 five_steps "$tmp/b.jsonl"
kill -9 -- "-$server"
killed_at=$(wc -l < "$tmp/b.jsonl")
status=0
wait "$job" || status=$?
end=$(date +%s.%N)
[ "$status" -eq 0 ] || { cat "$tmp/b.log"; fail "the job whose tracking server died exited $status"; }
[ "$killed_at" -lt 30 ] || fail "the server was killed only after the last step"
[ "$(wc -l < "$tmp/b.jsonl")" -eq 30 ] || { cat "$tmp/b.log"; fail "not every step ran"; }
grep -q "mlflow: metrics dropped (runs/log-batch: .*); training goes on" "$tmp/b.log" || { cat "$tmp/b.log"; fail "the drop is not logged with its reason"; }
grep -q "mlflow: run [0-9a-f]* not marked FINISHED: runs/update: " "$tmp/b.log" || { cat "$tmp/b.log"; fail "the lost set-terminated is not logged"; }
grep -q "mlflow: run [0-9a-f]* ended FINISHED: [0-9]* metric values sent, [1-9][0-9]* dropped (last: " "$tmp/b.log" ||
    { cat "$tmp/b.log"; fail "the dropped metrics are not counted"; }
echo "server killed after step $killed_at; the 30-step job took $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"

# --- a server that cannot serve at the start: a warning, or an error under log_required ---------
# A stub that answers its one request (fsdpd's get-by-name) HTTP 503 and records the
# Authorization header: MLFLOW_TRACKING_TOKEN goes there as a bearer token, and nowhere else.
"$py" - "$tmp/stub.port" "$tmp/stub.auth" <<'PY' &
import http.server, os, sys
class Stub(http.server.BaseHTTPRequestHandler):
    def answer(self):
        open(sys.argv[2], "a").write("%s\n" % self.headers.get("Authorization"))
        body = b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "down for maintenance"}'
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *args): pass
server = http.server.HTTPServer(("127.0.0.1", 0), Stub)
server.timeout = 60  # it ends by itself
open(sys.argv[1] + ".new", "w").write(str(server.server_port))
os.rename(sys.argv[1] + ".new", sys.argv[1])
server.handle_request()
PY
bg_pids+=("$!")
wait_for 20 test -s "$tmp/stub.port"
stub=http://127.0.0.1:$(cat "$tmp/stub.port")
MLFLOW_TRACKING_TOKEN=$token "$fsdpd" --job "$tmp/job.json" "${common[@]}" --runtime.mlflow_uri="$stub" \
    --checkpoint.dir="$tmp/c.ckpt" --runtime.metrics="$tmp/c.jsonl" > "$tmp/c.log" 2>&1 ||
    { cat "$tmp/c.log"; fail "a tracking server that cannot serve failed the job"; }
grep -q "warning: runtime.log_to mlflow: cannot log to $stub: experiments/get-by-name: HTTP 503 TEMPORARILY_UNAVAILABLE: down for maintenance; training without MLflow" "$tmp/c.log" ||
    { cat "$tmp/c.log"; fail "no warning with the reason"; }
[ "$(cat "$tmp/stub.auth")" = "Bearer $token" ] || fail "the token was not sent as a bearer token: $(cat "$tmp/stub.auth")"
! grep -qF "$token" "$tmp/c.log" || fail "the token is in the log"
[ "$(wc -l < "$tmp/c.jsonl")" -eq 4 ] || fail "the job without its tracking server did not train"
# The killed server's address: nothing listens there any more.
expect_error 1 "runtime.log_required: MLflow at $uri: experiments/get-by-name: " "$fsdpd" --job "$tmp/job.json" \
    "${common[@]}" --checkpoint.dir="$tmp/d.ckpt" --runtime.log_required=true
grep -q "Couldn't connect\|Connection refused\|Failed to connect" "$tmp/cmd.err" || { cat "$tmp/cmd.err"; fail "the reason is not named"; }
! grep -q "rank 0: started" "$tmp/cmd.err" || fail "workers started although the tracking server is required"
echo "PASS: mlflow"
