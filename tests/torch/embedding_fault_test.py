"""gradsync.torch.ShardedEmbeddingBag when a process dies: a shard killed
under replicas, a shard killed and restarted from its checkpoint and
journal, and a worker lost in an elastic job (real jobs of 2 or 3 workers
and 2 or 3 parameter-server shards)."""
import os
import re
import signal
import sys
import time

import pytest

import job

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "embedding_worker.py")
WORKERS, SERVERS = 2, 2


def wait_for_text(log, text, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log.seek(0)
        if text in log.read():
            return True
        time.sleep(0.005)
    return False


def finished(j):
    """The workers' results once each exited 0 with one."""
    results = j.wait_workers(180)
    for rank, (code, result, _) in results.items():
        assert code == 0 and result is not None, job.describe(results)
    return results


def replica_job(kill):
    """The replicas scenario on 3 shards holding each partition twice;
    with `kill`, the second shard process started is SIGKILLed when worker
    0 prints MARK."""
    env = {"GRADSYNC_PS_MODE": "sync", "GRADSYNC_EMBEDDING_OPTIMIZER": "adagrad",
           "GRADSYNC_EMBEDDING_LR": "0.05", "GRADSYNC_EMBEDDING_REPLICAS": "2",
           "GRADSYNC_METRICS_BASE_PORT": str(job.free_port(span=WORKERS)),
           "STEPS": "60"}
    j = job.Job("replicas_kill%d" % kill, env)
    try:
        j.start_scheduler(WORKERS, 3)
        j.start_workers([WORKER, "replicas"], WORKERS)
        if kill:
            worker0 = [log for name, _, log in j.procs if name == "worker0"][0]
            shard1 = [proc for name, proc, _ in j.procs if name == "server1"][0]
            wait_for_text(worker0, "MARK", 120)
            shard1.send_signal(signal.SIGKILL)
        results = finished(j)
        return {rank: r for rank, (_, r, _) in results.items()}, results
    finally:
        j.stop()


def test_a_killed_shard_loses_no_acknowledged_push_and_training_goes_on_within_1_s():
    whole, _ = replica_job(kill=False)
    killed, raw = replica_job(kill=True)
    for rank in range(WORKERS):
        # Each step's push of each of the 3 partitions went to both holders,
        # and its replication lag was observed once.
        assert whole[rank]["replication_lags"] == 60 * 3, whole
        assert killed[rank]["steps"] == 60, killed
        # Every acknowledged push is in the copies: the rows of the job
        # without the kill, bit for bit.
        assert killed[rank]["rows_digest"] == whole[rank]["rows_digest"], (whole, killed)
        assert killed[rank]["longest_step_s"] < 1.0, killed
        # (The killed process's shard rank is the scheduler's to give.)
        assert re.search(r"scheduler reports server \d dead: its process \(pid \d+\) exited",
                         raw[rank][2]), raw[rank][2][-3000:]
    print("longest step after the kill (s):",
          [killed[r]["longest_step_s"] for r in range(WORKERS)],
          "without:", [whole[r]["longest_step_s"] for r in range(WORKERS)])


def restart_job(kill):
    """The replicas scenario with one holder per partition on 2 shards that
    keep checkpoints and a journal; with `kill`, shard 1 is SIGKILLed when
    worker 0 prints MARK and started again with the same flags once the
    scheduler finds it silent."""
    env = {"GRADSYNC_PS_MODE": "sync", "GRADSYNC_EMBEDDING_OPTIMIZER": "adagrad",
           "GRADSYNC_EMBEDDING_LR": "0.05", "GRADSYNC_EMBEDDING_ADMIT_AFTER": "2",
           "STEPS": "60"}
    j = job.Job("restart_kill%d" % kill, env)
    checkpoints = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"),
                               "embedding_restart%d.%d" % (kill, os.getpid()))
    ports = [job.free_port() for _ in range(SERVERS)]
    try:
        j.start_scheduler(WORKERS, SERVERS, scheduler_flags=["--server_grace_ms=60000"],
                          server_flags=lambda s: [
                              "--rank=%d" % s, "--data_port=%d" % ports[s],
                              "--checkpoint_dir=" + checkpoints,
                              "--checkpoint_interval_s=0.25"])
        j.start_workers([WORKER, "replicas"], WORKERS)
        restarted = None
        if kill:
            logs = {name: (proc, log) for name, proc, log in j.procs}
            assert wait_for_text(logs["worker0"][1], "MARK", 120)
            logs["server1"][0].send_signal(signal.SIGKILL)
            logs["server1"][0].wait()
            assert wait_for_text(logs["scheduler"][1], "is silent: waiting up to", 60)
            restarted = j.spawn("server1.restarted", j.server_argv[1], job.base_env(j.env))
        results = finished(j)
        restored = ""
        if restarted is not None:
            log = [log for name, _, log in j.procs if name == "server1.restarted"][0]
            log.seek(0)
            restored = log.read()
        return {rank: r for rank, (_, r, _) in results.items()}, restored
    finally:
        j.stop()


def test_a_shard_killed_and_restarted_resumes_its_rows_from_checkpoint_and_journal():
    whole, _ = restart_job(kill=False)
    killed, restored = restart_job(kill=True)
    # Restored from disk: the rows, their Adagrad sums and admission counts,
    # and the round worker 0 or 1 had pushed before the kill.
    found = re.search(r"restored checkpoint: .*embedding table partitions of (\d+) rows.*"
                      r"replayed (\d+) journal records", restored)
    assert found and int(found.group(1)) > 0, restored[-3000:]
    for rank in range(WORKERS):
        assert killed[rank]["steps"] == 60, killed
        # Every acknowledged push survived the kill: the rows of the job
        # without it, bit for bit.
        assert killed[rank]["rows_digest"] == whole[rank]["rows_digest"], (whole, killed)
    print("restored rows:", found.group(1), "journal records replayed:", found.group(2),
          "longest step after the kill (s):", [killed[r]["longest_step_s"] for r in range(WORKERS)])


@pytest.mark.parametrize("kill_at,slow_rank", [("push", -1), ("start", 1)])
def test_the_survivors_of_a_worker_lost_in_an_elastic_job_go_on_alike(kill_at, slow_rank):
    """3 workers under --min_workers=2, sync shards: the worker started as
    rank 2 dies with its push of step 20 in flight ("push"), or before step
    20 while worker 1's push of step 19 is held up, so that round 19 is
    open when the membership changes and the shards drop it ("start").
    The 2 others recover (the step of the state's root, the round before it
    pushed again), train all 60 steps and read the same rows and head."""
    env = {"GRADSYNC_PS_MODE": "sync", "GRADSYNC_EMBEDDING_OPTIMIZER": "adagrad",
           "GRADSYNC_EMBEDDING_LR": "0.05", "STEPS": "60", "KILL_AT": kill_at,
           "SLOW_RANK": str(slow_rank)}
    code, output = job.launch([sys.executable, WORKER, "elastic"], workers=3,
                              servers=SERVERS, timeout_s=240, extra_env=env,
                              flags=["--min_workers=2"])
    assert code == 0, output[-6000:]
    assert "2 of 3 workers exited with code 0 (1 lost)" in output, output[-6000:]
    results = [r for r in job.json_lines(output) if "state_sha256" in r]
    assert len(results) == 2, output[-6000:]
    assert len({r["state_sha256"] for r in results}) == 1, results
    for r in results:
        assert r["steps"] == 60 and r["table_step"] == 60, r
        assert r["workers"] == 2 and r["membership_epoch"] == 1, r
        assert len(r["recovered_at"]) == 1 and 19 <= r["recovered_at"][0] <= 21, r
        assert r["last_loss"] < r["first_loss"], r
    print("recovered at step:", [r["recovered_at"] for r in results],
          "loss first/last:", [(round(r["first_loss"], 4), round(r["last_loss"], 4))
                               for r in results])
