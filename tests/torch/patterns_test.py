"""Patterns of real training scripts with DistributedOptimizer, each in a
real 4-process job (tests/torch/patterns_worker.py)."""
import os

import job

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "patterns_worker.py")
WORKERS = 4


def run(scenario, **kwargs):
    return job.run_ok(WORKER, scenario, WORKERS, torchrun=False, **kwargs)


def test_clipping_with_skip_synchronize_and_an_lr_scheduler():
    for rank, r in run("clip").items():
        assert r["is_optimizer"], r
        assert r["moved"] > 1e-3, r
        assert r["max_difference"] <= 2e-6, (rank, r)
        assert abs(r["lr"] - 0.025) < 1e-12, r  # StepLR halved it twice
        assert r["steps"] == 4, r  # one synchronisation per step, not two


def test_an_overflow_step_is_skipped_everywhere_and_poisons_nothing():
    env = {"GRADSYNC_COMPRESSION": "topk:ratio=0.3,ef=1",
           "GRADSYNC_COMPRESSION_MIN_BYTES": "0"}
    results = run("overflow", extra_env=env)
    for rank, r in results.items():
        assert r["skipped"] == [1], (rank, r)
        assert r["finite_after"], (rank, r)
        assert r["checksum"] == results[0]["checksum"], (rank, r)


def test_two_optimizers_in_one_process():
    for rank, r in run("two_optimizers").items():
        assert r["moved"] > 1e-3, r
        assert r["max_difference"] <= 2e-6, (rank, r)


def test_a_parameter_no_rank_used_keeps_no_gradient_and_stays():
    for rank, r in run("unused_everywhere").items():
        assert r["grad_none"], (rank, r)
        assert r["moved"] == 0.0, (rank, r)
        assert r["used_moved"] > 1e-3, (rank, r)


def test_channels_last_model():
    for rank, r in run("channels_last").items():
        assert r["channels_last"], r
        assert r["max_difference"] <= 2e-6, (rank, r)


def test_checkpoint_loaded_on_rank_0_then_broadcast(tmp_path):
    results = run("checkpoint", extra_env={"CHECKPOINT_DIR": str(tmp_path)})
    for rank, r in results.items():
        assert r == results[0], (rank, r, results[0])
    assert results[0]["step"] and all(s == 4.0 for s in results[0]["step"])


def test_sparse_embedding_through_the_optimizer():
    for rank, r in run("sparse").items():
        assert r["sparse"], r
        assert r["moved"] > 1e-3, r
        assert r["max_difference"] <= 2e-6, (rank, r)


def test_ten_thousand_parameters_with_long_names():
    for rank, r in run("large_model", timeout_s=240).items():
        assert r["values"] == [-5.0], (rank, r)  # two steps of lr 1 x 2.5
        assert r["steps"] == 2, r
