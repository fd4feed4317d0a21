#!/usr/bin/env bash
# All-reduce latency and busbw of a ring whose workers share hosts two by
# two: 4 workers (bench/lanes_worker, the Communicator's direct
# all-reduces) on two hosts, so that each host's two workers are ring
# neighbours over shared memory and the two links between the hosts are
# TCP streams. Two settings are compared, jobs of the two alternating, REPS
# of each per size: every all-reduce round the ring (ring_algorithm=ring)
# and by halving and doubling (ring_algorithm=halving_doubling: the
# partners of level 0 share a host and memory, those of level 1 do not).
#
#   bazel run --config=opt //bench:mixed_ring_bench -- [SIZES] [REPS] [SECURITY] [RATE] [COMPARE]
#   SIZES: "4096 1048576 16777216" (bytes, default); REPS: 2 (default);
#   SECURITY: none (default) or curve (one job key; the streams sealed);
#   RATE: "" (default): the hosts are two addresses of loopback (127.0.0.1
#   and 127.0.0.2); a rate such as 10gbit: simulated hosts
#   (tools/simhosts.sh, needs root), the scheduler on host 0 and the
#   workers on hosts 1 and 2, each host's link shaped to RATE;
#   COMPARE: algorithm (default; the only comparison).
#
# Prints per size and setting the median over the repetitions of rank
# 0's p50 (ms) and busbw = 2(n-1)/n x bytes / p50 (GB/s), and the second
# setting's p50 over the first's (halving_doubling / ring).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/../tools/simhosts.sh" ] && [ -x "$here/lanes_worker" ]; then
  cd "$here/.."
else
  cd "$here/mixed_ring_bench.runfiles/gradsync"
fi
SIZES=${1:-"4096 1048576 16777216"}
REPS=${2:-2}
SECURITY=${3:-none}
RATE=${4:-}
COMPARE=${5:-algorithm}
case "$SECURITY" in
  none | curve) ;;
  *) echo "mixed_ring_bench: SECURITY must be none or curve, not '$SECURITY'" >&2; exit 2 ;;
esac
case "$COMPARE" in
  algorithm) flag=ring_algorithm settings=(ring halving_doubling) ;;
  *) echo "mixed_ring_bench: COMPARE must be algorithm, not '$COMPARE'" >&2; exit 2 ;;
esac

tmp=$(mktemp -d)
pids=()
name="gsmr$$"
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if [ -n "$RATE" ]; then tools/simhosts.sh down "$name"; fi
}
trap cleanup EXIT
# on HOST CMD...: runs CMD on host HOST (0: the scheduler's; 1, 2: the
# workers'); addr HOST: its address.
if [ -n "$RATE" ]; then
  if ! tools/simhosts.sh check; then
    echo "mixed_ring_bench: RATE needs network namespaces (root)" >&2
    exit 1
  fi
  tools/simhosts.sh up "$name" 3 "$RATE"
  on() { tools/simhosts.sh run "$name" "$@"; }
  addr() { tools/simhosts.sh addr "$name" "$1"; }
else
  on() { shift; "$@"; }
  addr() { echo "127.0.0.$(($1 > 0 ? $1 : 1))"; }
fi
if [ "$SECURITY" = curve ]; then
  wire/gradsync_keygen "$tmp/job.key" > /dev/null
  keying=(GRADSYNC_KEY_FILE="$tmp/job.key")
else
  keying=(GRADSYNC_SECURITY=none)
fi
results="$tmp/results.jsonl"

# One job: a scheduler and 4 workers, --$flag=SETTING; appends rank 0's
# line to $results.
run_job() {  # SETTING BYTES
  local setting=$1 bytes=$2 iters=20 port r workers=() sched
  [ "$bytes" -le 4194304 ] && iters=50
  [ "$bytes" -le 65536 ] && iters=300
  sched=$(addr 0)
  port=$(on 0 /usr/bin/python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$sched")
  local common=("${keying[@]}" GRADSYNC_NUM_WORKERS=4 GRADSYNC_METRICS_BASE_PORT=0
                GRADSYNC_SCHEDULER="$sched:$port")
  on 0 env "${common[@]}" server/gradsync_server --role=scheduler --host="$sched" --port="$port" \
    --num_workers=4 --metrics_port=0 > "$tmp/scheduler.log" 2>&1 &
  pids+=($!)
  for r in 0 1 2 3; do
    on $((r / 2 + 1)) env "${common[@]}" GRADSYNC_HOST="$(addr $((r / 2 + 1)))" bench/lanes_worker --rank=$r \
      --"$flag"="$setting" --bytes="$bytes" --iters="$iters" \
      > "$tmp/worker$r.log" 2>&1 &
    workers+=($!)
    pids+=($!)
  done
  for w in "${workers[@]}"; do
    if ! wait "$w"; then
      echo "mixed_ring_bench: a worker failed ($setting, $bytes bytes); logs in $tmp" >&2
      tail -5 "$tmp"/worker*.log >&2
      exit 1
    fi
  done
  wait || true  # the scheduler ends with the job
  if ! grep -q "use shared memory" "$tmp/worker0.log"; then
    echo "mixed_ring_bench: worker 0 used no shared memory; logs in $tmp" >&2
    exit 1
  fi
  line=$(grep '^{' "$tmp/worker0.log" | tail -1)
  echo "{\"setting\":\"$setting\",${line#\{}" >> "$results"
}

for bytes in $SIZES; do
  for ((rep = 0; rep < REPS; rep++)); do
    if ((rep % 2 == 0)); then order="${settings[*]}"; else order="${settings[1]} ${settings[0]}"; fi
    for setting in $order; do run_job "$setting" "$bytes"; done
  done
  echo "$bytes bytes done" >&2
done

/usr/bin/python3 - "$results" "$SECURITY" "${RATE:-loopback}" "$flag" "${settings[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
security, rate, flag, first, second = sys.argv[2:7]
print("links between the hosts:", rate)
print("%-6s %10s %-16s %5s %9s %10s %9s" % ("sec", "bytes", flag, "runs", "p50_ms", "busbw_GBs",
                                            "x_" + first))
for size in sorted({r["bytes"] for r in rows}):
    med = {}
    for t in (first, second):
        runs = [r for r in rows if r["bytes"] == size and r["setting"] == t]
        p50 = statistics.median(r["p50_ms"] for r in runs)
        n = runs[0]["workers"]
        busbw = 2 * (n - 1) / n * size / (p50 / 1e3) / 1e9
        med[t] = p50
        ratio = "%.2fx" % (med[second] / med[first]) if t == second else ""
        print("%-6s %10d %-16s %5d %9.3f %10.3f %9s" % (security, size, t, len(runs), p50, busbw,
                                                       ratio))
        print(json.dumps({"rate": rate, "security": security, "bytes": size, flag: t,
                          "runs": len(runs), "p50_ms": p50, "busbw_gbps": round(busbw, 3)}),
              file=sys.stderr)
PY
