#!/usr/bin/env bash
# The all-reduce round the ring against halving and doubling (the setting
# ring_algorithm, docs/design/halving_doubling.md) between simulated hosts
# (tools/simhosts.sh; needs root): a scheduler on host 0 and W workers on
# hosts 1-W (bench/lanes_worker: timed all-reduces of each size through the
# Communicator, over TCP streams), every link shaped to RATE, and what each
# host sends delayed by DELAY. The two algorithms run by turns, REPS times.
#
#   bazel run --config=opt //bench:algorithm_bench -- [RATE] [DELAY] [WORKERS] [SIZES] [REPS] \
#     [SECURITY] [FLAGS]
#   RATE: 10gbit (default); DELAY: 0 (default: none) or e.g. 50us (netem,
#   which the kernel must have); WORKERS: 4
#   (default) or 8, 16 ...; SIZES: "1048576 4194304 16777216" (default);
#   REPS: 2 (default); SECURITY: none (default) or curve; FLAGS: more
#   settings for every worker (e.g. "--ring_chunk_bytes=262144").
#
# Per size and algorithm: the median over the repetitions of rank 0's p50,
# busbw_gbit = 2(n-1)/n x bytes x 8 / p50, and x_ring = the ring's p50 over
# this one's (above 1: faster than the ring).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/../tools/simhosts.sh" ] && [ -x "$here/lanes_worker" ]; then
  cd "$here/.."
else
  cd "$here/algorithm_bench.runfiles/gradsync"
fi
RATE=${1:-10gbit}
DELAY=${2:-0}
WORKERS=${3:-4}
SIZES=${4:-"1048576 4194304 16777216"}
REPS=${5:-2}
SECURITY=${6:-none}
read -r -a FLAGS <<< "${7:-}"
case "$SECURITY" in
  curve | none) ;;
  *) echo "algorithm_bench: SECURITY must be curve or none, not '$SECURITY'" >&2; exit 2 ;;
esac
if ! tools/simhosts.sh check; then
  echo "algorithm_bench: needs network namespaces (root)" >&2
  exit 1
fi

source bench/sim_job.sh
sim_begin gsab
tools/simhosts.sh up "$name" $((WORKERS + 1)) "$RATE"
if [ "$DELAY" != 0 ]; then
  for ((h = 0; h <= WORKERS; h++)); do
    if ! tools/simhosts.sh delay "$name" "$h" "$DELAY"; then
      echo "algorithm_bench: cannot delay the links (no netem in this kernel?); DELAY=0 runs" >&2
      exit 1
    fi
  done
fi
sim_workers=$WORKERS
if [ "$SECURITY" = curve ]; then
  job_env=(GRADSYNC_KEY_FILE="$tmp/job.key")
else
  job_env=(GRADSYNC_SECURITY=none)
fi
shard_flags=()
results="$tmp/results.jsonl"
port=9300
for ((rep = 0; rep < REPS; rep++)); do
  for bytes in $SIZES; do
    for algorithm in ring halving_doubling; do
      port=$((port + 1))
      tag="$algorithm.$bytes.$rep"
      worker_cmd=(bench/lanes_worker --ring_algorithm="$algorithm" --bytes="$bytes" "${FLAGS[@]}")
      sim_job "$name" "$tag" "$port" 0
      line=$(grep '^{' "$tmp/$tag.worker0.log" | tail -1)
      echo "{\"algorithm\":\"$algorithm\",\"rep\":$rep,${line#\{}" >> "$results"
      if [ "$algorithm" = halving_doubling ] &&
        ! grep -q "by halving and doubling" "$tmp/$tag.worker0.log"; then
        echo "algorithm_bench: the job did not all-reduce by halving and doubling" >&2
        grep -h "ring_algorithm" "$tmp/$tag.worker0.log" >&2 || true
        exit 1
      fi
    done
    echo "$bytes bytes, repetition $((rep + 1)) of $REPS done" >&2
  done
done

/usr/bin/python3 - "$results" "$RATE" "$DELAY" "$SECURITY" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rate, delay, security = sys.argv[2:5]
p50 = {}
for r in rows:
    p50.setdefault((r["bytes"], r["algorithm"]), []).append(r["p50_ms"])
print("%-8s %-6s %-5s %3s %-17s %9s %9s %11s %7s  %s" % (
    "rate", "delay", "sec", "n", "algorithm", "MiB", "p50_ms", "busbw_gbit", "x_ring",
    "p50_ms each"))
n = rows[0]["workers"]
for (size, algorithm), ms in sorted(p50.items(), key=lambda kv: (kv[0][0], kv[0][1] != "ring")):
    med = statistics.median(ms)
    ring = statistics.median(p50[(size, "ring")])
    busbw = 2 * (n - 1) / n * size * 8 / (med / 1e3) / 1e9
    print("%-8s %-6s %-5s %3d %-17s %9.1f %9.2f %11.2f %7.2f  %s" % (
        rate, delay, security, n, algorithm, size / 2**20, med, busbw, ring / med,
        " ".join("%.2f" % m for m in ms)))
    print(json.dumps({"rate": rate, "delay": delay, "security": security, "workers": n,
                      "algorithm": algorithm, "bytes": size, "p50_ms": med,
                      "busbw_gbit": round(busbw, 3), "x_ring": round(ring / med, 3)}),
          file=sys.stderr)
PY
