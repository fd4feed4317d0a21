#!/usr/bin/env bash
# gradsync_launch under a real Slurm: munged, slurmctld on simulated host 0
# and one slurmd per simulated host 1-4 (tools/simhosts.sh; each slurmd its
# own node name and address), all started by this test and removed at the
# end. `srun -N4 --ntasks-per-node=1 gradsync_launch --servers=1 -- ps_worker`
# must run the scheduler on the first node, the shard on the second and two
# workers on the others, each with its rank and the scheduler's address from
# the allocation alone, and train with exact averages (parameter server,
# sync). Skips (exit 0 with a line "GRADSYNC-SKIPPED: why", which
# tools/test_summary.sh counts as skipped) without root or without Slurm
# (slurm-wlm, munge). Then a ring job of two tasks a node, an elastic ring
# job under Slurm that loses a worker task and goes on, and one whose
# worker tasks restart their trainer (below).
set -euo pipefail

for tool in slurmctld slurmd srun sinfo munged; do
  if ! command -v "$tool" > /dev/null; then
    echo "GRADSYNC-SKIPPED: $tool is not installed (tools/install_deps.sh installs slurm-wlm and munge)"
    exit 0
  fi
done
if ! tools/simhosts.sh check; then
  echo "GRADSYNC-SKIPPED: network namespaces cannot be made here (not root)"
  exit 0
fi

here=$PWD
name="gsslurm$$"
# Short paths: munge's socket path must fit a sockaddr_un.
dir=$(mktemp -d /tmp/gsslurm.XXXXXX)
chmod 700 "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -f "$dir/munged.pid" ] && kill "$(cat "$dir/munged.pid")" 2>/dev/null || true
  tools/simhosts.sh down "$name"
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.log "$dir"/*.out; do
    [ -f "$f" ] || continue
    echo "--- $f"
    tail -15 "$f"
  done
  exit 1
}

tools/simhosts.sh up "$name" 5
head -c 1024 /dev/urandom > "$dir/munge.key"
chmod 400 "$dir/munge.key"
munged --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" --force

controller=$(hostname)
cat > "$dir/slurm.conf" <<EOF
ClusterName=gradsync
SlurmctldHost=$controller($(tools/simhosts.sh addr "$name" 0))
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
ReturnToService=2
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
StateSaveLocation=$dir/state
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmdLogFile=$dir/slurmd.%n.log
SlurmdSpoolDir=$dir/spool.%n
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
SelectType=select/linear
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
EOF
for i in 1 2 3 4; do
  echo "NodeName=node$i NodeAddr=$(tools/simhosts.sh addr "$name" "$i") CPUs=2 State=UNKNOWN" \
    >> "$dir/slurm.conf"
done
echo "PartitionName=debug Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
mkdir -p "$dir/state" "$dir"/spool.node{1,2,3,4}
export SLURM_CONF="$dir/slurm.conf"

tools/simhosts.sh run "$name" 0 slurmctld -D -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
pids+=($!)
for i in 1 2 3 4; do
  tools/simhosts.sh run "$name" "$i" slurmd -D -N "node$i" -f "$SLURM_CONF" \
    > "$dir/slurmd$i.out" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do
  idle=$(tools/simhosts.sh run "$name" 0 sinfo -h -t idle -o "%D" 2>/dev/null || true)
  [ "$idle" = "4" ] && break
  sleep 0.3
done
[ "$idle" = "4" ] || fail "the 4 slurmd nodes did not come up idle (sinfo: '$idle')"
echo "slurm: controller on host 0, node1..node4 idle on hosts 1-4"

"$here/wire/gradsync_keygen" "$dir/job.key" > /dev/null
code=0
tools/simhosts.sh run "$name" 0 env GRADSYNC_KEY_FILE="$dir/job.key" GRADSYNC_METRICS_BASE_PORT=0 \
  timeout 120 srun -N4 --ntasks-per-node=1 --kill-on-bad-exit=1 --label \
  "$here/launcher/gradsync_launch" --servers=1 --server_binary="$here/server/gradsync_server" \
  -- "$here/tests/ps_worker" --path=ps --mode=average --steps=4 > "$dir/srun.out" 2>&1 || code=$?
cat "$dir/srun.out"
[ "$code" -eq 0 ] || fail "srun exited $code"
grep -q "listening on tcp://$(tools/simhosts.sh addr "$name" 1)" "$dir/srun.out" ||
  fail "the scheduler did not run on node1"
grep -q "joined job .* as server 0" "$dir/srun.out" || fail "no shard joined"
for r in 0 1; do
  grep -q "worker $r step 3 ok" "$dir/srun.out" || fail "worker $r did not finish with exact averages"
done
echo "PASSED: scheduler on node1, shard on node2, workers 0 and 1 on node3 and node4"

# Two tasks a node: `srun -N3 --ntasks-per-node=2` puts the scheduler and
# worker 0 on node1 and two workers on each of node2 and node3. Under the
# job key the ring's links between the nodes are sealed TCP streams and the
# two workers of a node are neighbours over shared memory; every worker
# gets the exact averages.
code=0
tools/simhosts.sh run "$name" 0 env GRADSYNC_KEY_FILE="$dir/job.key" GRADSYNC_METRICS_BASE_PORT=0 \
  timeout 120 srun -N3 --ntasks-per-node=2 --kill-on-bad-exit=1 --label \
  "$here/launcher/gradsync_launch" --servers=0 --server_binary="$here/server/gradsync_server" \
  -- "$here/tests/ps_worker" --path=allreduce --mode=average --steps=4 > "$dir/pairs.out" 2>&1 ||
  code=$?
cat "$dir/pairs.out"
[ "$code" -eq 0 ] || fail "srun of two tasks a node exited $code"
for r in 0 1 2 3 4; do
  grep -q "worker $r step 3 ok" "$dir/pairs.out" ||
    fail "worker $r of two tasks a node did not finish with exact averages"
done
grep -q "ring over TCP streams, sealed" "$dir/pairs.out" ||
  fail "the ring between the nodes did not run over sealed TCP streams"
[ "$(grep -c "use shared memory, the others TCP streams (1 peer(s))" "$dir/pairs.out")" -eq 4 ] ||
  fail "workers 1-4 did not each reach their node's other worker through shared memory"
echo "PASSED: two tasks a node: sealed TCP streams between the nodes, shared memory within them"

# expect_finals WORLD EPOCH FILE: WORLD workers of tests/elastic_worker
# finished 400 steps in epoch EPOCH with equal parameters.
expect_finals() {
  local finals
  finals=$(grep -o "final step 400 world $1 epoch $2 params [0-9a-f]*" "$3" || true)
  [ "$(wc -l <<<"$finals")" -eq "$1" ] && [ -n "$finals" ] ||
    fail "expected $1 workers to finish 400 steps in epoch $2, got: $finals"
  [ "$(awk '{print $NF}' <<<"$finals" | sort -u | wc -l)" -eq 1 ] ||
    fail "the workers' parameters differ: $finals"
}

# An elastic job under Slurm: 3 ring workers with --min_workers=2; one
# worker task is killed mid-training and the step goes on without it
# (srun --kill-on-bad-exit=0): the 2 survivors finish every step and agree
# bit for bit.
tools/simhosts.sh run "$name" 0 env GRADSYNC_KEY_FILE="$dir/job.key" GRADSYNC_METRICS_BASE_PORT=0 \
  GRADSYNC_HEARTBEAT_MS=200 GRADSYNC_MISSED_HEARTBEATS=5 \
  timeout 180 srun -N4 --ntasks-per-node=1 --kill-on-bad-exit=0 --label \
  "$here/launcher/gradsync_launch" --servers=0 --min_workers=2 \
  --server_binary="$here/server/gradsync_server" \
  -- "$here/tests/elastic_worker" --steps=400 > "$dir/elastic.out" 2>&1 &
srun_pid=$!
for _ in $(seq 1 600); do
  grep -q "reached step 50" "$dir/elastic.out" && break
  kill -0 "$srun_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "reached step 50" "$dir/elastic.out" || fail "the elastic job did not reach step 50"
victim=$(pgrep -f "$here/tests/elastic_worker" | tail -n 1)
[ -n "$victim" ] || fail "no elastic_worker process to kill"
kill -9 "$victim"
echo "slurm: killed worker process $victim at step 50 or later"
wait "$srun_pid" || true  # the killed task makes srun's status non-zero
cat "$dir/elastic.out"
expect_finals 2 1 "$dir/elastic.out"
echo "PASSED: elastic step under Slurm: 2 survivors finished 400 steps with equal parameters"

# --restarts under Slurm: the worker tasks run their trainer and start it
# again when it fails. Worker 2 SIGKILLs itself after step 100, once; its
# task starts it again, it joins the running job, and all 3 finish in epoch
# 2 with equal parameters; srun exits 0.
code=0
tools/simhosts.sh run "$name" 0 env GRADSYNC_KEY_FILE="$dir/job.key" GRADSYNC_METRICS_BASE_PORT=0 \
  GRADSYNC_HEARTBEAT_MS=200 GRADSYNC_MISSED_HEARTBEATS=5 \
  timeout 180 srun -N4 --ntasks-per-node=1 --kill-on-bad-exit=0 --label \
  "$here/launcher/gradsync_launch" --servers=0 --min_workers=2 --restarts=1 \
  --server_binary="$here/server/gradsync_server" \
  -- "$here/tests/elastic_worker" --steps=400 --die_at_step=100 --die_rank=2 \
  --die_once="$dir/died_once" > "$dir/restart.out" 2>&1 || code=$?
cat "$dir/restart.out"
[ "$code" -eq 0 ] || fail "srun exited $code with a worker restarted"
grep -q "worker 2 was killed by signal 9; starting it again (restart 1 of 1)" "$dir/restart.out" ||
  fail "worker 2's task did not start it again"
expect_finals 3 2 "$dir/restart.out"
echo "PASSED: --restarts under Slurm: the restarted worker joined and 3 finished with equal parameters"
