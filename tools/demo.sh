#!/usr/bin/env bash
# The main job on one machine: for each mode, gradsync_launch starts a
# scheduler (and parameter-server shards where the mode uses them) and
# WORKERS data-parallel trainers of an MLP on Fashion-MNIST
# (examples/fmnist_trainer); every trainer ends with a JSON line, and the
# script prints one table row per mode.
#
#   tools/demo.sh                        # every mode in MODES
#   MODE=allreduce-ring tools/demo.sh    # one mode
#
# WORKERS (4), SERVERS (2, for the modes that use servers), PORT (29500; 0
# picks a free port) and EPOCHS (3) override the defaults; TRAINER_FLAGS adds
# flags to every trainer (--batch=, --lr=, --momentum=, --seed=).
# KILL_STEP=N runs each mode as an elastic job that loses a worker and gets
# it back: worker 2 SIGKILLs itself before step N, the launcher restarts it
# (--min_workers=WORKERS-1 --restarts=1) and it joins the running job.
set -euo pipefail
cd "$(dirname "$0")/.."

WORKERS=${WORKERS:-4}
SERVERS=${SERVERS:-2}
PORT=${PORT:-29500}
EPOCHS=${EPOCHS:-3}
MODE=${MODE:-}
TRAINER_FLAGS=${TRAINER_FLAGS:-}
KILL_STEP=${KILL_STEP:-}
LAUNCH_FLAGS=""
if [ -n "$KILL_STEP" ]; then
  LAUNCH_FLAGS="--min_workers=$((WORKERS - 1)) --restarts=1"
  TRAINER_FLAGS="$TRAINER_FLAGS --kill_rank=2 --kill_step=$KILL_STEP"
fi

# One mode per entry: name|uses servers (0 or 1)|job environment|trainer flags.
# Stale gradients act as momentum of their own: the asynchronous mode keeps
# less server-side momentum (0.5) and SSP none, each with the learning rate
# that reached the synchronous accuracy in 3 epochs. PowerSGD's error
# feedback with the trainer's momentum 0.9 diverges; it runs plain SGD.
# Top-k with error feedback keeps the momentum in the error feedback (deep
# gradient compression's momentum correction, docs/compression.md) and the
# trainer takes plain SGD steps: over seeds 1-8 the ps mode reached
# 0.8608-0.8728 where the trainer's momentum after the exchange reached
# 0.8462-0.8638. The ps mode keeps uncompressed replies: on one host they
# travel through shared memory, and fp16 replies gave lower accuracies at the
# same speed (docs/benchmarks.md). It also warms up (warmup=60: from a quarter
# of the elements down to 1% over the first 60 of 705 steps): over seeds 1-8,
# 0.8626-0.8708 (mean 0.8683) against 0.8573-0.8717 (mean 0.8670) without, for
# 57% more bytes; on the ring the warm-up made no difference (seeds 1-2).
# The environment reaches the scheduler, the shards and the trainers alike.
MODES=(
  "allreduce-ring|0||--path=allreduce --backend=ring"
  "ps-sync|1|GRADSYNC_PS_MODE=sync|--path=ps"
  "ps-async|1|GRADSYNC_PS_MODE=async GRADSYNC_OPTIMIZER=momentum GRADSYNC_MOMENTUM=0.5 GRADSYNC_LR=0.025|--path=ps"
  "ps-ssp2|1|GRADSYNC_PS_MODE=ssp GRADSYNC_STALENESS=2 GRADSYNC_OPTIMIZER=sgd GRADSYNC_LR=0.15|--path=ps"
  "allreduce-fp16|0||--path=allreduce --backend=ring --compression=fp16"
  "allreduce-topk-ef|0||--path=allreduce --backend=ring --compression=topk:ratio=0.01,ef=1,momentum=0.9 --momentum=0"
  "allreduce-powersgd|0||--path=allreduce --backend=ring --compression=powersgd:rank=4 --momentum=0 --lr=0.1"
  "ps-topk-ef|1|GRADSYNC_PS_MODE=sync|--path=ps --compression=topk:ratio=0.01,ef=1,momentum=0.9,warmup=60 --momentum=0"
)

selected=()
for entry in "${MODES[@]}"; do
  [ -z "$MODE" ] || [ "${entry%%|*}" = "$MODE" ] && selected+=("$entry")
done
if [ ${#selected[@]} -eq 0 ]; then
  echo "demo: unknown MODE '$MODE'; known: $(printf '%s ' "${MODES[@]%%|*}")" >&2
  exit 2
fi

tools/install_deps.sh
bazel build --config=opt //server:gradsync_server //launcher:gradsync_launch \
    //examples:fmnist_trainer
bin=$(bazel info --config=opt bazel-bin 2>/dev/null)
logs=$(mktemp -d "${TMPDIR:-/tmp}/gradsync_demo.XXXXXX")

# The value of "key" in a one-line JSON object.
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" <<<"$2"; }

run_mode() {
  local name=$1 uses_servers=$2 job_env=$3 flags=$4 servers=0
  [ "$uses_servers" = 1 ] && servers=$SERVERS
  echo
  echo "=== $name: $WORKERS workers, $servers servers, $EPOCHS epochs ==="
  # shellcheck disable=SC2086  # the environment and flags are words
  env $job_env "$bin/launcher/gradsync_launch" --workers="$WORKERS" --servers="$servers" --port="$PORT" \
      --log_dir="$logs/$name" $LAUNCH_FLAGS -- "$bin/examples/fmnist_trainer" --mode="$name" \
      --epochs="$EPOCHS" $flags $TRAINER_FLAGS 2>&1 | tee "$logs/$name.out"
}

rows=()
status=0
for entry in "${selected[@]}"; do
  IFS='|' read -r name uses_servers job_env flags <<<"$entry"
  if run_mode "$name" "$uses_servers" "$job_env" "$flags"; then
    row=$(sed -n 's/^\[worker 0\] \({.*}\)$/\1/p' "$logs/$name.out" | tail -n 1)
    # The shards measure staleness; take the largest any shard saw.
    staleness=$(sed -n 's/.*shard stats:.*max staleness \([0-9]*\).*/\1/p' "$logs/$name.out" |
                sort -n | tail -n 1)
    [ -n "$staleness" ] && row=$(sed "s/\"max_staleness\":[0-9]*/\"max_staleness\":$staleness/" <<<"$row")
    rows+=("$row")
  else
    rows+=("{\"mode\":\"$name\",\"failed\":true}")
    status=1
  fi
done

echo
printf '%-18s %9s %8s %10s %14s %11s %8s %8s %9s\n' mode test_acc wall_s samples/s \
    wire_bytes compression p50_ms p99_ms staleness
for row in "${rows[@]}"; do
  if [ -n "$(field failed "$row")" ] || [ -z "$(field test_accuracy "$row")" ]; then
    printf '%-18s FAILED (logs in %s)\n' "$(field mode "$row")" "$logs"
    status=1
    continue
  fi
  printf '%-18s %9s %8s %10s %14s %11s %8s %8s %9s\n' "$(field mode "$row")" \
      "$(field test_accuracy "$row")" "$(field wall_s "$row")" "$(field samples_per_s "$row")" \
      "$(field wire_bytes "$row")" "$(field compression_ratio "$row")" "$(field p50_ms "$row")" \
      "$(field p99_ms "$row")" "$(field max_staleness "$row")"
done
echo "(wire_bytes: gradient bytes one worker sent during training; p50/p99: Synchronize"
echo " latency on worker 0; wall_s: training time; logs in $logs)"
echo
printf '%s\n' "${rows[@]}"
exit "$status"
