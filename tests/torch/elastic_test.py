"""gradsync.torch.elastic in a real job: examples/torch_elastic.py (the CNN
on Fashion-MNIST, DistributedOptimizer, SGD with momentum, clipping, an
ElasticSampler) on 4 workers under gradsync_launch --min_workers=3; the
worker started as rank 2 SIGKILLs itself mid-epoch. The 3 others finish,
exit 0, hold bit-equal parameters and optimizer state and learn as the
non-elastic job does. And the ElasticSampler alone: re-dealt mid-epoch it
trains every sample of the epoch once."""
import os
import sys
import tempfile

import pytest
import torch

import job
import torch_cnn_e2e_test
from gradsync.torch import elastic

SCRIPT = os.path.join(job.ROOT, "examples", "torch_elastic.py")
STEPS = 80
KILL_STEP = 30
KILLED = 2
# The restart tests: the survivors wait before this step until the restarted
# worker is in, so it trains steps of its own however slow its start.
HOLD = ["--hold_step=50", "--hold_workers=4"]


def _train_and_kill(flags, servers=0, extra_env=None, script_flags=()):
    """The job with launcher `flags`; (killed line, result lines, output)."""
    code, output = job.launch(
        [sys.executable, SCRIPT, "--max_steps=%d" % STEPS,
         "--kill_rank=%d" % KILLED, "--kill_step=%d" % KILL_STEP] +
        list(script_flags),
        workers=4, servers=servers, timeout_s=240, extra_env=extra_env,
        flags=flags)
    if "unknown flag --restarts" in output:
        pytest.skip("this gradsync_launch cannot restart a worker")
    assert code == 0, output[-6000:]
    lines = job.json_lines(output)
    killed = [r for r in lines if "killed_at" in r]
    results = [r for r in lines if "state_sha256" in r]
    assert len(killed) == 1, output[-6000:]
    return killed[0], results, output


def _alike(results):
    """Every result trained all steps, learned, and holds the same state."""
    for r in results:
        assert r["steps"] == STEPS, r
        assert r["test_accuracy"] >= torch_cnn_e2e_test.MIN_ACCURACY, r
    assert len({r["state_sha256"] for r in results}) == 1, results
    assert len({r["test_accuracy"] for r in results}) == 1, results


def test_survivors_of_a_killed_worker_finish_alike():
    killed, results, output = _train_and_kill(["--min_workers=3"])
    assert "3 of 4 workers exited with code 0 (1 lost)" in output, output[-6000:]
    assert len(results) == 3, output[-6000:]
    assert sorted(r["rank"] for r in results) == [0, 1, 2], results
    _alike(results)
    for r in results:
        assert r["workers"] == 3 and r["membership_epoch"] == 1, r
        assert r["recoveries"] == 1, r
        assert r["recovered_at"][0] > killed["killed_at"], r
        assert r["last_loss"] <= torch_cnn_e2e_test.MAX_LOSS_RATIO * \
            r["first_loss"], r


def test_a_departing_worker_is_let_go_and_the_others_finish_alike():
    """gradsync.depart() (a preemption notice): the worker leaves on
    purpose, exits 0, and the 3 others go on at once in epoch 1."""
    code, output = job.launch(
        [sys.executable, SCRIPT, "--max_steps=%d" % STEPS,
         "--depart_rank=%d" % KILLED, "--depart_step=%d" % KILL_STEP],
        workers=4, servers=0, timeout_s=240, flags=["--min_workers=3"])
    assert code == 0, output[-6000:]
    assert "all 4 workers exited with code 0" in output, output[-6000:]
    assert "left: it left the job (preempted)" in output, output[-6000:]
    lines = job.json_lines(output)
    departed = [r for r in lines if "departed_at" in r]
    results = [r for r in lines if "state_sha256" in r]
    assert len(departed) == 1 and len(results) == 3, output[-6000:]
    _alike(results)
    for r in results:
        assert r["workers"] == 3 and r["membership_epoch"] == 1, r
        assert r["recovered_at"][0] > departed[0]["departed_at"], r


def test_parameter_server_survivors_finish_alike():
    """path=ps, 2 shards that average: the survivors redo the step that did
    not close and finish alike."""
    killed, results, output = _train_and_kill(
        ["--min_workers=3"], servers=2,
        extra_env={"GRADSYNC_PATH": "ps", "GRADSYNC_PS_MODE": "sync"})
    assert "3 of 4 workers exited with code 0 (1 lost)" in output, output[-6000:]
    assert len(results) == 3, output[-6000:]
    _alike(results)
    for r in results:
        assert r["workers"] == 3 and r["membership_epoch"] == 1, r
        assert r["recovered_at"][0] > killed["killed_at"], r


def test_parameter_server_that_steps_takes_a_restarted_worker_back():
    """path=ps, 2 shards that step (momentum): the restarted worker joins,
    and all 4 end with the shards' parameters."""
    killed, results, output = _train_and_kill(
        ["--min_workers=3", "--restarts=1"], servers=2,
        extra_env={"GRADSYNC_PATH": "ps", "GRADSYNC_PS_MODE": "sync",
                   "GRADSYNC_OPTIMIZER": "momentum", "GRADSYNC_LR": "0.05",
                   "GRADSYNC_MOMENTUM": "0.9"}, script_flags=HOLD)
    assert "4 of 4 workers exited with code 0 (1 restarted)" in output, \
        output[-6000:]
    assert len(results) == 4, output[-6000:]
    assert len({r["state_sha256"] for r in results}) == 1, results
    for r in results:
        assert r["steps"] == STEPS, r
        assert r["test_accuracy"] >= torch_cnn_e2e_test.MIN_ACCURACY, r
        assert r["workers"] == 4 and r["membership_epoch"] == 2, r
    joiners = [r for r in results if r["joined"]]
    assert len(joiners) == 1 and joiners[0]["rank"] == 3, results


def test_a_restarted_worker_rejoins_with_the_live_state():
    """--restarts=1: the killed worker is started again, joins the running
    job (epoch > 0 when run() starts), takes the state of a survivor and
    ends with the same state as the 3 others. Every 20 steps rank 0 writes
    a checkpoint and all meet in a barrier, the joiner as the others; the
    survivors wait for it before step 50."""
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    killed, results, output = _train_and_kill(
        ["--min_workers=3", "--restarts=1"],
        script_flags=HOLD + ["--checkpoint_every=20",
                             "--checkpoint_dir=" + directory])
    assert "4 of 4 workers exited with code 0 (1 restarted)" in output, \
        output[-6000:]
    assert len(results) == 4, output[-6000:]
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3], results
    _alike(results)
    joiners = [r for r in results if r["joined"]]
    assert len(joiners) == 1 and joiners[0]["rank"] == 3, results
    for r in results:
        assert r["workers"] == 4 and r["membership_epoch"] == 2, r
        # A survivor recovers from the loss and the join, once or twice
        # (the join may come while it recovers); the joiner once.
        assert r["recoveries"] >= 1 and (r["recoveries"] == 1 or
                                         not r["joined"]), r
    assert joiners[0]["recovered_at"][0] > killed["killed_at"], joiners
    assert "hold:" not in output, output[-6000:]
    # Steps 20, ..., 80: the joiner (in by step 50) meets the others at
    # the checkpoints 60 and 80.
    assert all(r["checkpoints"] >= 2 for r in results), results
    assert max(r["checkpoints"] for r in results) >= 3, results
    saved = torch.load(os.path.join(directory, "checkpoint.pt"))
    assert saved["step"] == STEPS, saved["step"]


class _Member:
    """What ElasticSampler asks of a communicator: rank and size."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def _take(sampler, batches, batch):
    """The indices this rank trains in its next `batches` batches."""
    return list(iter(sampler))[:batches * batch]


def test_sampler_redealt_mid_epoch_trains_each_sample_once():
    data = torch.utils.data.TensorDataset(torch.arange(1000))
    batch = 8
    before = [elastic.ElasticSampler(data, batch, seed=3, comm=_Member(r, 4))
              for r in range(4)]
    for s in before:
        s.set_epoch(1)
    seen = []
    for s in before:
        seen += _take(s, 5, batch)
    for s in before:
        for _ in range(5):
            s.record_batch()
    after = []
    for rank in range(3):  # worker 2 is lost; the others re-ranked densely
        s = before[[0, 1, 3][rank]]
        s.reset(rank, 3)
        after.append(s)
    assert len({len(s) for s in after}) == 1
    for s in after:
        seen += list(iter(s))
    # 5 x 4 x 8 before, 3 x ((1000 - 160) // 3) after: all but the
    # remainder the last deal drops, each once.
    assert len(seen) == len(set(seen)) == 160 + 3 * (840 // 3)
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(4))
    assert sorted(seen) == sorted(order[:len(seen)].tolist())
