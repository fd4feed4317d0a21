#!/usr/bin/env bash
# Step time of each mode of examples/fmnist_trainer across simulated hosts
# (tools/simhosts.sh; needs root): a scheduler on host 0, 4 workers on hosts
# 1-4 and, for the ps modes, 2 shards on hosts 5-6, every link shaped to each
# RATE in turn. Beside each mode: the link-bound ideal of the uncompressed
# ring, 2(n-1)/n x model bytes / rate per step.
#
#   bazel run --config=opt //bench:shaped_link_bench -- [RATES] [EPOCHS] [SLOW] [MODES] [SECURITY] \
#     [SLOW_LINK] [ORDER]
#   RATES: "1gbit 10gbit" (default); EPOCHS: 3 (default, the demo's);
#   SLOW: a rate for worker 3's host alone (a slow host; default none);
#   MODES: which modes, comma-separated (default ring,ps-sync,fp16,topk-ef,powersgd;
#   also ps-async);
#   SECURITY: curve (default: every process with the job's key), none
#   (security=none, no key), or both: each mode with CURVE and then without,
#   one after the other on the same links, and a column x_plain with the
#   step time over the same mode's without CURVE.
#   SLOW_LINK: a rate for the link between the hosts of workers 0 and 1 alone
#   (default none); ORDER: measured (default), rank, or both: each mode with
#   ring_order=measured and then =rank, and a column x_rank with the step
#   time over rank order's.
#
# Per mode: step_ms = training wall time / steps (rank 0), sync_p50_ms =
# median Synchronize time, wire KiB per step (what rank 0 sent), test
# accuracy after EPOCHS, t85_s = training time until the test accuracy first
# reached 0.85 (evaluated every 25 steps, outside the training time; "-": not
# within EPOCHS), straggler_ms = the shards' mean straggler wait per round
# (first to last push of a round; ps-sync), and ratios: step / ideal ring
# step, step / fp16 step.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/../tools/simhosts.sh" ] && [ -x "$here/../examples/fmnist_trainer" ]; then
  cd "$here/.."
else
  cd "$here/shaped_link_bench.runfiles/gradsync"
fi
RATES=${1:-"1gbit 10gbit"}
EPOCHS=${2:-3}
SLOW=${3:-}
SELECTED=${4:-ring,ps-sync,fp16,topk-ef,powersgd}
SECURITY=${5:-curve}
SLOW_LINK=${6:-}
ORDER=${7:-measured}
case "$ORDER" in
  measured | rank) ORDERS="$ORDER" ;;
  both) ORDERS="measured rank" ;;
  *) echo "shaped_link_bench: ORDER must be measured, rank or both, not '$ORDER'" >&2; exit 2 ;;
esac
case "$SECURITY" in
  curve) SECURITIES="curve" ;;
  none) SECURITIES="none" ;;
  both) SECURITIES="curve none" ;;
  *) echo "shaped_link_bench: SECURITY must be curve, none or both, not '$SECURITY'" >&2; exit 2 ;;
esac

if ! tools/simhosts.sh check; then
  echo "shaped_link_bench: needs network namespaces (root)" >&2
  exit 1
fi

MODES=(
  "ring|0||--path=allreduce --backend=ring"
  "ps-sync|1|GRADSYNC_PS_MODE=sync|--path=ps"
  "fp16|0||--path=allreduce --backend=ring --compression=fp16"
  "topk-ef|0||--path=allreduce --backend=ring --compression=topk:ratio=0.01,ef=1"
  "powersgd|0||--path=allreduce --backend=ring --compression=powersgd:rank=4 --momentum=0 --lr=0.1"
  "ps-async|1|GRADSYNC_PS_MODE=async GRADSYNC_OPTIMIZER=momentum GRADSYNC_MOMENTUM=0.5 GRADSYNC_LR=0.025|--path=ps"
)

source bench/sim_job.sh
sim_begin gssl
results="$tmp/results.jsonl"
port=9100

for rate in $RATES; do
  tools/simhosts.sh down "$name"
  tools/simhosts.sh up "$name" 7 "$rate"
  [ -z "$SLOW" ] || tools/simhosts.sh shape "$name" 4 "$SLOW"
  [ -z "$SLOW_LINK" ] || tools/simhosts.sh pair "$name" 1 2 "$SLOW_LINK" "$rate"
  for entry in "${MODES[@]}"; do
    IFS='|' read -r mode servers env flags <<< "$entry"
    [[ ",$SELECTED," == *",$mode,"* ]] || continue
    for security in $SECURITIES; do
    for order in $ORDERS; do
      port=$((port + 1))
      tag="$rate.$mode.$security.$order"
      nserv=$((servers * 2))
      if [ "$security" = curve ]; then
        keying=(GRADSYNC_KEY_FILE="$tmp/job.key")
      else
        keying=(GRADSYNC_SECURITY=none)
      fi
      job_env=("${keying[@]}" GRADSYNC_RING_ORDER=$order $env)
      shard_flags=()
      worker_cmd=(examples/fmnist_trainer --mode="$mode" --epochs="$EPOCHS" --eval_every_steps=25
                  --target_accuracy=0.85 $flags)
      sim_job "$name" "$tag" "$port" "$nserv"
      line=$(grep '^{' "$tmp/$tag.worker0.log" | tail -1)
      # The shards' mean straggler wait per round, averaged over the shards.
      straggler=$(cat /dev/null $(for ((s = 0; s < nserv; s++)); do echo "$tmp/$tag.server$s.log"; done) |
        sed -n 's/.*straggler wait mean \([0-9.e+-]*\) ms.*/\1/p' |
        awk '{ t += $1; n++ } END { if (n) printf "%.3f", t / n; else printf "-1" }')
      echo "{\"rate\":\"$rate\",\"security\":\"$security\",\"order\":\"$order\",\"straggler_ms\":$straggler,${line#\{}" >> "$results"
      echo "$rate $mode ($security, $order order) done" >&2
    done
    done
  done
done

/usr/bin/python3 - "$results" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def bits_per_s(rate):
    m = re.match(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
n = 4
print("%-8s %-9s %-5s %-8s %9s %11s %12s %9s %9s %8s %8s %8s %8s %7s %12s" % (
    "rate", "mode", "sec", "order", "step_ms", "sync_p50_ms", "wire_KiB/st", "ideal_ms", "x_ideal",
    "x_fp16", "x_plain", "x_rank", "test_acc", "t85_s", "straggler_ms"))
def step_of(r):
    return r["wall_s"] / r["steps"] * 1e3
for rate in dict.fromkeys(r["rate"] for r in rows):
    group = [r for r in rows if r["rate"] == rate]
    plain = {(r["mode"], r["order"]): r for r in group if r["security"] == "none"}
    ranked = {(r["mode"], r["security"]): r for r in group if r["order"] == "rank"}
    ring = next((r for r in group if r["mode"] == "ring"), None)
    # The ring sends 2(n-1)/n of the model per step: its wire bytes.
    ideal_ms = (ring["wire_bytes"] / ring["steps"] * 8 / bits_per_s(rate) * 1e3
                if ring else float("nan"))
    fp16_ms = {(r["security"], r["order"]): step_of(r) for r in group if r["mode"] == "fp16"}
    for r in group:
        step_ms = r["wall_s"] / r["steps"] * 1e3
        t85 = r["time_to_target_s"]
        straggler = r["straggler_ms"]
        base = plain.get((r["mode"], r["order"]))
        x_plain = step_ms / step_of(base) if base else None
        by_rank = ranked.get((r["mode"], r["security"]))
        x_rank = step_ms / step_of(by_rank) if by_rank else None
        fp16 = fp16_ms.get((r["security"], r["order"]))
        print("%-8s %-9s %-5s %-8s %9.2f %11.2f %12.1f %9.2f %9.2f %8s %8s %8s %8.4f %7s %12s" % (
            rate, r["mode"], r["security"], r["order"], step_ms, r["p50_ms"],
            r["wire_bytes"] / r["steps"] / 1024, ideal_ms, step_ms / ideal_ms,
            "%.2f" % (step_ms / fp16) if fp16 else "-",
            "%.2f" % x_plain if x_plain else "-", "%.2f" % x_rank if x_rank else "-",
            r["test_accuracy"],
            "%.2f" % t85 if t85 >= 0 else "-", "%.2f" % straggler if straggler >= 0 else "-"))
        print(json.dumps({"rate": rate, "mode": r["mode"], "security": r["security"],
                          "order": r["order"],
                          "step_over_rank_order": round(x_rank, 3) if x_rank else None,
                          "step_ms": round(step_ms, 3),
                          "step_over_plain": round(x_plain, 3) if x_plain else None,
                          "ideal_ring_ms": round(ideal_ms, 3),
                          "step_over_ideal": round(step_ms / ideal_ms, 3),
                          "test_accuracy": r["test_accuracy"],
                          "time_to_85_s": t85 if t85 >= 0 else None,
                          "straggler_wait_ms": straggler if straggler >= 0 else None}),
              file=sys.stderr)
PY
