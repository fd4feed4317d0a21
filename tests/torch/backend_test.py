"""The "gradsync" torch.distributed backend in real 4-process jobs started
the way torchrun starts them (no gloo group unless a test compares with
one, no agent that kills the others when one fails)."""
import os

import pytest

import job

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "backend_worker.py")
WORKERS = 4


def run(scenario, **kwargs):
    return job.run_ok(WORKER, scenario, WORKERS, **kwargs)


def test_collectives_equal_gloo_on_every_dtype():
    for rank, r in run("collectives").items():
        assert r["backend"] == "gradsync", r
        assert r["mismatches"] == [], (rank, r["mismatches"])
        # 8 dtypes x 7 collectives, reduce_scatter (2 forms x 2 dtypes), AVG
        # and the async all_reduce.
        assert r["checked"] == 8 * 7 + 4 + 2, r
        assert r["gloo"] >= 30, r  # most of them against gloo itself
        assert r["completed"], r


@pytest.mark.parametrize("scenario", ["ddp", "ddp_hook", "ddp_hook_view"])
def test_ddp_over_the_backend_equals_ddp_over_gloo_bit_for_bit(scenario):
    """ddp_hook_view: with gradient_as_bucket_view, as scripts that save
    the gradients' memory set it."""
    for rank, r in run(scenario).items():
        assert r["identical"], (rank, r)
        assert r["backend"] == "gradsync", r
        if scenario != "ddp":
            assert r["steps"] >= 2, r  # gradsync's buckets took over


def test_ddp_hook_over_tcp_streams_equals_ddp_over_gloo_bit_for_bit():
    """Without shared memory (as between hosts in a job without CURVE) the
    ring's lanes are TCP streams (docs/design/tcp_streams.md): the same
    bits as DDP over gloo."""
    results = job.run_workers("ddp_hook", [WORKER, "ddp_hook"], WORKERS,
                              extra_env={"GRADSYNC_RING_SHM": "false"})
    for rank, (code, r, _) in results.items():
        assert code == 0 and r is not None, job.describe(results)
        assert r["identical"] and r["steps"] >= 2, (rank, r)
    assert "ring over TCP streams" in results[0][2], job.describe(results)


def test_ddp_hook_on_the_parameter_server_over_the_backend():
    # gradsync_launch's way in (GRADSYNC_* and torchrun's variables), two
    # shards: DDP's buckets go to the parameter server, DDP's own
    # broadcasts through the gradsync group.
    for rank, r in run("ddp_hook", torchrun=False, servers=2,
                       extra_env={"GRADSYNC_PATH": "ps"}).items():
        assert r["identical"], (rank, r)
        assert r["steps"] >= 2, r


def test_two_hooked_models_in_one_process():
    for rank, r in run("two_hooks").items():
        assert r["identical"], (rank, r)


@pytest.mark.parametrize("scenario", ["killed", "killed_hook"])
def test_a_killed_rank_makes_every_other_rank_raise_in_backward(
        scenario, tmp_path):
    kill_file = tmp_path / "killed_at"
    results = job.run_workers(scenario, [WORKER, scenario], WORKERS,
                              timeout_s=60,
                              extra_env={"KILL_TIME_FILE": str(kill_file),
                                         "GRADSYNC_OP_TIMEOUT_MS": "20000"})
    killed_at = float(kill_file.read_text())
    assert results[3][0] == -9, job.describe(results)
    for rank in range(3):
        code, result, _ = results[rank]
        assert code == 0 and result is not None, job.describe(results)
        assert result["error"] is not None, result
        assert result["step"] == 3, result
        # Named by heartbeats (200 ms x 15 in these jobs), long before the
        # 20 s operation deadline.
        assert "worker 3" in result["error"] or "rank 3" in result["error"], \
            result["error"]
        assert result["at"] - killed_at < 15, result


def test_sparse_embedding_through_the_hook_equals_the_dense_average():
    for rank, r in run("sparse_hook").items():
        assert r["sparse"], r
        assert r["max_difference"] <= 1e-6, (rank, r)


def test_sparse_embedding_on_the_parameter_server_is_refused_clearly():
    results = job.run_workers("sparse_ps", [WORKER, "sparse_hook"], WORKERS,
                              torchrun=False, servers=1, timeout_s=60,
                              extra_env={"GRADSYNC_PATH": "ps"})
    for rank, (code, _, text) in results.items():
        assert code != 0, job.describe(results)
        assert "parameter server takes dense gradients only" in text, \
            job.describe(results)
