#!/usr/bin/env bash
# The main job on one machine: a scheduler, 2 parameter-server shards and 4
# workers rendezvous over TCP on loopback, check that every node reaches its
# peers, pass barriers, share an NCCL-style id, and shut down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
bazel build //server:gradsync_server //tests:rendezvous_worker

WORKERS=${WORKERS:-4}
SERVERS=${SERVERS:-2}
PORT=${PORT:-29500}
logs=$(mktemp -d)
export GRADSYNC_SCHEDULER=127.0.0.1:${PORT}
export GRADSYNC_NUM_WORKERS=${WORKERS}
export GRADSYNC_NUM_SERVERS=${SERVERS}
bin=bazel-bin

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

"$bin/server/gradsync_server" --role=scheduler --port="$PORT" >"$logs/scheduler.log" 2>&1 &
scheduler=$!
pids+=("$scheduler")
for s in $(seq 0 $((SERVERS - 1))); do
  "$bin/server/gradsync_server" --role=server >"$logs/server$s.log" 2>&1 &
  pids+=($!)
done
workers=()
for w in $(seq 0 $((WORKERS - 1))); do
  "$bin/tests/rendezvous_worker" --barriers=3 --nccl_id >"$logs/worker$w.log" 2>&1 &
  workers+=($!)
  pids+=($!)
done
status=0
for p in "${workers[@]}"; do wait "$p" || status=1; done
wait "$scheduler" || status=1
for f in "$logs"/*.log; do sed "s/^/[$(basename "$f" .log)] /" "$f"; done
echo
if [ "$status" -eq 0 ]; then
  echo "demo: scheduler on $GRADSYNC_SCHEDULER, $SERVERS servers and $WORKERS workers rendezvoused,"
  echo "      checked reachability, passed 3 barriers, shared the NCCL id and shut down cleanly."
else
  echo "demo: FAILED (logs in $logs)"
fi
exit "$status"
