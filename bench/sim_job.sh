# Sourced by the benchmarks that run jobs on simulated hosts
# (tools/simhosts.sh), from the repository's root (or its runfiles).
#
# sim_begin PREFIX: a temporary directory ($tmp) with a job key
# ($tmp/job.key), the hosts' name ($name: PREFIX and the shell's pid) and
# the processes to kill ($pids); on exit they are killed and the hosts of
# $name taken down.
sim_begin() {
  tmp=$(mktemp -d)
  name="$1$$"
  pids=()
  trap sim_cleanup EXIT
  wire/gradsync_keygen "$tmp/job.key" > /dev/null
}
sim_cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  tools/simhosts.sh down "$name"
}

#
# sim_job NAME TAG PORT SHARDS: one job on the hosts of NAME, a scheduler on
# host 0 listening on PORT, W workers on hosts 1-W (W: $sim_workers, 4
# when unset; worker R runs "${worker_cmd[@]}" --rank=R) and SHARDS shards
# on hosts W+1 and up, every process with
# the environment "${job_env[@]}", each shard with "${shard_flags[@]}";
# logs in $tmp/TAG.{scheduler,serverS,workerR}.log, process ids added to
# the caller's pids. Returns once every process ended; exits 1 (naming the
# logs) when a worker failed.
sim_job() {
  local name=$1 tag=$2 port=$3 shards=$4 sched s r w nw=${sim_workers:-4}
  sched=$(tools/simhosts.sh addr "$name" 0)
  local common=("${job_env[@]}" GRADSYNC_NUM_WORKERS="$nw" GRADSYNC_NUM_SERVERS="$shards"
                GRADSYNC_METRICS_BASE_PORT=0 GRADSYNC_SCHEDULER="$sched:$port")
  tools/simhosts.sh run "$name" 0 env "${common[@]}" server/gradsync_server --role=scheduler \
    --host="$sched" --port="$port" --num_workers="$nw" --num_servers="$shards" --metrics_port=0 \
    > "$tmp/$tag.scheduler.log" 2>&1 &
  pids+=($!)
  for ((s = 0; s < shards; s++)); do
    tools/simhosts.sh run "$name" $((s + nw + 1)) env "${common[@]}" server/gradsync_server \
      --role=server --host="$(tools/simhosts.sh addr "$name" $((s + nw + 1)))" --metrics_port=0 \
      "${shard_flags[@]}" > "$tmp/$tag.server$s.log" 2>&1 &
    pids+=($!)
  done
  local workers=()
  for ((r = 0; r < nw; r++)); do
    tools/simhosts.sh run "$name" $((r + 1)) env "${common[@]}" \
      GRADSYNC_HOST="$(tools/simhosts.sh addr "$name" $((r + 1)))" \
      "${worker_cmd[@]}" --rank=$r > "$tmp/$tag.worker$r.log" 2>&1 &
    workers+=($!)
    pids+=($!)
  done
  for w in "${workers[@]}"; do
    if ! wait "$w"; then
      echo "$(basename "$0" .sh): $tag failed; logs in $tmp" >&2
      tail -5 "$tmp/$tag.worker0.log" >&2
      exit 1
    fi
  done
  wait || true  # the scheduler and shards end with the job
}
