#!/usr/bin/env bash
# Busbw of a large all-reduce between simulated hosts (tools/simhosts.sh;
# needs root) with the ring in 1, 2, 4 ... lanes (the setting ring_lanes,
# docs/design/ring_lanes.md): a scheduler on host 0 and 4 workers on hosts
# 1-4 (bench/lanes_worker: --iters timed all-reduces of BYTES through the
# Communicator), every link shaped to RATE and, with FLOW, every TCP flow
# capped at FLOW too (a network with a per-flow limit).
#
#   bazel run --config=opt //bench:ring_lanes_bench -- [RATE] [FLOW] [LANES] [SECURITY] [BYTES] \
#     [PATH]
#   RATE: 10gbit (default); FLOW: a per-flow cap, e.g. 2gbit ("" for none,
#   the default); LANES: "1 2 4" (default; "auto" too, ring_lanes=auto);
#   SECURITY: none (default), curve
#   or both; BYTES: 67108864 (64 MiB, default); PATH: ring (default: direct
#   all-reduces over ring_lanes) or ps (one bucket of BYTES through 2 shards
#   on hosts 5 and 6 in sync mode, ps_lanes connections to each, 4 MiB
#   partitions).
#
# Per run: p50_ms of rank 0's all-reduces, busbw_gbit = 2(n-1)/n x BYTES x 8
# / p50 (for ps, what a worker's link carries is 2 x BYTES: the same figure
# counts 1.5 x BYTES), x_link = busbw / RATE, x_lanes1 = busbw / the same
# security's with one lane.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/../tools/simhosts.sh" ] && [ -x "$here/lanes_worker" ]; then
  cd "$here/.."
else
  cd "$here/ring_lanes_bench.runfiles/gradsync"
fi
RATE=${1:-10gbit}
FLOW=${2:-}
LANES=${3:-"1 2 4"}
SECURITY=${4:-none}
BYTES=${5:-67108864}
PATH_=${6:-ring}
case "$PATH_" in
  ring) SHARDS=0 ;;
  ps) SHARDS=2 ;;
  *) echo "ring_lanes_bench: PATH must be ring or ps, not '$PATH_'" >&2; exit 2 ;;
esac
case "$SECURITY" in
  curve | none) SECURITIES="$SECURITY" ;;
  both) SECURITIES="none curve" ;;
  *) echo "ring_lanes_bench: SECURITY must be curve, none or both, not '$SECURITY'" >&2; exit 2 ;;
esac
if ! tools/simhosts.sh check; then
  echo "ring_lanes_bench: needs network namespaces (root)" >&2
  exit 1
fi

source bench/sim_job.sh
sim_begin gsrl
tools/simhosts.sh up "$name" $((5 + SHARDS)) "$RATE" "$FLOW"
results="$tmp/results.jsonl"
port=9200
for security in $SECURITIES; do
  for lanes in $LANES; do
    port=$((port + 1))
    tag="$security.$lanes"
    if [ "$security" = curve ]; then
      keying=(GRADSYNC_KEY_FILE="$tmp/job.key")
    else
      keying=(GRADSYNC_SECURITY=none)
    fi
    if [ "$PATH_" = ps ]; then
      how=(--path=ps --bucketed --ps_lanes="$lanes" --bucket_bytes="$BYTES")
    else
      how=(--ring_lanes="$lanes")
    fi
    job_env=("${keying[@]}")
    shard_flags=(--ps_mode=sync)
    worker_cmd=(bench/lanes_worker "${how[@]}" --bytes="$BYTES")
    sim_job "$name" "$tag" "$port" "$SHARDS"
    line=$(grep '^{' "$tmp/$tag.worker0.log" | tail -1)
    echo "{\"security\":\"$security\",${line#\{}" >> "$results"
    echo "$lanes lanes ($security) done" >&2
    grep -ho "ring_lanes=auto: .*" "$tmp/$tag.worker0.log" >&2 || true
  done
done

/usr/bin/python3 - "$results" "$RATE" "${FLOW:-none}" "$PATH_" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rate, flow, path = sys.argv[2], sys.argv[3], sys.argv[4]
def bits_per_s(text):
    m = re.match(r"(\d+(?:\.\d+)?)([kmg]?)bit", text)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
print("%-5s %-8s %-8s %-5s %5s %10s %9s %9s %11s %7s %9s" % (
    "path", "rate", "flow", "sec", "lanes", "MiB", "p50_ms", "p90_ms", "busbw_gbit", "x_link",
    "x_lanes1"))
one = {r["security"]: r for r in rows if r["lanes"] == 1}
for r in rows:
    n = r["workers"]
    busbw = 2 * (n - 1) / n * r["bytes"] * 8 / (r["p50_ms"] / 1e3) / 1e9
    base = one.get(r["security"])
    x1 = r["p50_ms"] and base and base["p50_ms"] / r["p50_ms"]
    print("%-5s %-8s %-8s %-5s %5s %10.0f %9.2f %9.2f %11.2f %7.2f %9s" % (
        path, rate, flow, r["security"], r["lanes"], r["bytes"] / 2**20, r["p50_ms"], r["p90_ms"],
        busbw, busbw * 1e9 / bits_per_s(rate), "%.2f" % x1 if x1 else "-"))
    print(json.dumps({"path": path, "rate": rate, "flow": flow, "security": r["security"], "lanes": r["lanes"],
                      "bytes": r["bytes"], "p50_ms": r["p50_ms"], "busbw_gbit": round(busbw, 3),
                      "busbw_over_lanes1": round(x1, 3) if x1 else None}), file=sys.stderr)
PY
