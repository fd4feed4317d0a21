"""gradsync.torch.ShardedEmbeddingBag in real jobs of 2 workers and 2
parameter-server shards: against one process on the whole batch (a dense
head under DDP over the "gradsync" backend), refusals, a flood of new ids,
and the CTR example against DDP. Faults are in embedding_fault_test.py."""
import os
import sys
import tempfile
import time
import urllib.request

import pytest

import job

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "embedding_worker.py")
WORKERS, SERVERS, STEPS = 2, 2, 200


@pytest.mark.parametrize("optimizer,lr,prefetch", [("adagrad", "0.05", False),
                                                   ("adam", "0.01", True)])
def test_sync_rows_equal_one_process_after_200_steps(optimizer, lr, prefetch):
    """With `prefetch`, each step's rows are pulled after the step before's
    backward pass (ShardedEmbeddingBag.prefetch) and taken by the forward."""
    env = {"GRADSYNC_PS_MODE": "sync", "GRADSYNC_EMBEDDING_OPTIMIZER": optimizer,
           "GRADSYNC_EMBEDDING_LR": lr, "GRADSYNC_EMBEDDING_INIT_SCALE": "0.1",
           "STEPS": str(STEPS), "PREFETCH": "1" if prefetch else "0"}
    results = job.run_ok(WORKER, "train", WORKERS, torchrun=False,
                         servers=SERVERS, timeout_s=240, extra_env=env)
    r = results[0]
    assert all(v["steps"] == STEPS for v in results.values()), results
    assert all(v["prefetch_hits"] == (STEPS - 1 if prefetch else 0)
               for v in results.values()), results
    # The steps moved many rows a long way; both sides agree to float noise.
    assert r["rows_changed"] > 1000 and r["rows_moved"] > 0.05, r
    assert r["rows_difference"] <= 1e-5, r
    assert r["head_difference"] <= 1e-5, r


def test_a_table_at_another_width_is_refused_naming_both():
    results = job.run_ok(WORKER, "wrong_width", WORKERS, torchrun=False,
                         servers=SERVERS)
    for rank, r in results.items():
        assert r["error"] is not None, (rank, r)
        assert "rows of 4 elements, the table's are 8" in r["error"], r
        assert "ids must be in [0, 100): got 3 .. 100" in r["out_of_range"], r


def test_a_worker_that_pushes_nothing_waits_for_the_rounds_before_at_every_shard():
    marks = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    results = job.run_ok(WORKER, "behind", WORKERS, torchrun=False,
                         servers=SERVERS, extra_env={"MARKS": marks})
    assert all(r["steps"] == 6 for r in results.values()), results


CTR = os.path.join(job.ROOT, "examples", "torch_ctr.py")


def ctr(comm, servers, flags=()):
    env = {"OMP_NUM_THREADS": "1", "GRADSYNC_EMBEDDING_OPTIMIZER": "adagrad",
           "GRADSYNC_EMBEDDING_LR": "0.05"}
    argv = [sys.executable, CTR, "--comm=" + comm, "--vocab=200000", "--steps=150",
            "--eval_samples=20000"] + list(flags)
    code, out = job.launch(argv, workers=2, servers=servers, timeout_s=240, extra_env=env)
    if code != 0 and comm == "ddp-gloo" and "killed by signal" in out:
        # The anchor runs no gradsync code (torch's DDP over gloo alone);
        # its sparse all-reduce has crashed a worker with a corrupted heap
        # ("malloc(): unaligned tcache chunk detected"). Said, and run again
        # once: the anchor is the reference, not what is tested.
        print("the ddp-gloo anchor crashed; running it again:", out[-2000:])
        code, out = job.launch(argv, workers=2, servers=servers, timeout_s=240, extra_env=env)
    assert code == 0, out[-4000:]
    found = [r for r in job.json_lines(out) if r.get("comm") == comm]
    assert len(found) == 1, out[-4000:]
    return found[0]


def test_the_ctr_example_learns_as_the_tables_in_every_worker_do():
    """The example's two tables prefetch each step's rows (sync shards)."""
    ours, anchor = ctr("gradsync", 2, ["--prefetch"]), ctr("ddp-gloo", 0)
    assert ours["prefetch"], ours
    assert ours["best_auc"] == anchor["best_auc"], (ours, anchor)  # the same data
    # It learned (0.5 is a guess) and agrees with the anchor.
    assert ours["auc"] > 0.65 and anchor["auc"] > 0.65, (ours, anchor)
    assert abs(ours["auc"] - anchor["auc"]) <= 0.002, (ours, anchor)


def wait_peak_rss_mb(proc, timeout_s):
    """Waits for `proc` to exit; its peak RSS in MB (its rusage)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_maxrss / 1024.0
        time.sleep(0.02)
    raise AssertionError("pid %d did not exit in %d s" % (proc.pid, timeout_s))


def scrape(port):
    """{sample name with labels: value} of a shard's /metrics, or {}."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    samples = {}
    for line in text.splitlines():
        if line.startswith("gradsync_server_embedding"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def exported_the_flood(m, bound):
    """Whether a shard's scrape shows the flood's evictions within `bound`."""
    return (m.get("gradsync_server_embedding_tables") == 2 and
            0 < m.get("gradsync_server_embedding_bytes", 0) <= bound and
            m.get("gradsync_server_embedding_max_bytes") == bound and
            m.get('gradsync_server_embedding_rows_evicted_total{reason="memory"}', 0) > 0 and
            m.get("gradsync_server_embedding_rows_pushed_total", 0) > 0)


def flood_job(flood_ids, max_bytes):
    """The flood scenario; returns (worker 0's RESULT, each shard's peak
    RSS in MB and its closing "embedding stats" log line, and the
    embedding metrics each shard exported while the workers ran, the last
    scrape that had any)."""
    env = {"GRADSYNC_PS_MODE": "sync", "GRADSYNC_EMBEDDING_OPTIMIZER": "adagrad",
           "GRADSYNC_EMBEDDING_LR": "0.05", "GRADSYNC_EMBEDDING_MAX_BYTES": str(max_bytes),
           "FLOOD_IDS": str(flood_ids), "STEPS": "30"}
    hold = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "flood%d.done" % flood_ids)
    if os.path.exists(hold):
        os.remove(hold)
    if flood_ids:
        env["HOLD_FILE"] = hold  # the workers wait for the metrics to be read
    j = job.Job("flood%d" % flood_ids, env)
    try:
        j.start_scheduler(WORKERS, SERVERS, server_metrics=True)
        j.start_workers([WORKER, "flood"], WORKERS)
        metrics = [{} for _ in range(SERVERS)]
        workers = [proc for name, proc, _ in j.procs if name.startswith("worker")]
        deadline = time.monotonic() + 120
        while flood_ids and time.monotonic() < deadline and \
                any(proc.poll() is None for proc in workers):
            for s, port in enumerate(j.server_metrics_ports):
                metrics[s] = scrape(port) or metrics[s]
            if all(exported_the_flood(m, max_bytes) for m in metrics):
                break
            time.sleep(0.1)
        open(hold, "w").close()
        results = j.wait_workers(240)
        for rank, (code, result, _) in results.items():
            assert code == 0 and result is not None, job.describe(results)
        shards = [(name, proc, log) for name, proc, log in j.procs if name.startswith("server")]
        # Released when the workers left.
        rss = [wait_peak_rss_mb(proc, 60) for _, proc, _ in shards]
        stats = []
        for _, _, log in shards:
            log.seek(0)
            stats.append([l for l in log.read().splitlines() if "embedding stats" in l][-1])
        return results[0][1], rss, stats, metrics
    finally:
        j.stop()


def stat(line, name):
    """The number after `name` in a shard's "embedding stats" line."""
    return int(line.split(name + " ")[1].split(",")[0].split(" ")[0])


def test_a_flood_of_new_ids_keeps_every_shard_within_its_bound_and_loses_nothing_else():
    bound = 8 << 20
    calm, calm_rss, calm_stats, _ = flood_job(0, bound)
    # 1.5M new ids in all.
    flooded, flood_rss, flood_stats, metrics = flood_job(50000, bound)
    # The other table's rows are those of the job without the flood, bit for bit.
    assert flooded["rows_digest"] == calm["rows_digest"], (calm, flooded)
    for line in flood_stats:
        assert int(line.split(" bytes)")[0].split("(")[-1]) <= bound, line
        assert stat(line, "evicted for memory") > 0, line
    for line in calm_stats:
        assert stat(line, "evicted for memory") == 0, line
    # The shards exported it as it happened (every second).
    for m in metrics:
        assert exported_the_flood(m, bound), m
    print("peak RSS MB without / with the flood:", calm_rss, flood_rss)
    for calm_mb, flood_mb in zip(calm_rss, flood_rss):
        # The rows' bound, and at most one round of the flood in flight.
        assert flood_mb <= calm_mb + bound / 2 ** 20 + 48, (calm_rss, flood_rss)
