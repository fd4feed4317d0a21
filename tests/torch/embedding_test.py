"""gradsync.torch.ShardedEmbeddingBag in real jobs: 2 workers (a dense head
under DDP over the "gradsync" backend) and 2 parameter-server shards
holding the table, against one process on the whole batch."""
import os

import pytest

import job

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "embedding_worker.py")
WORKERS, SERVERS, STEPS = 2, 2, 200


@pytest.mark.parametrize("optimizer,lr", [("adagrad", "0.05"),
                                          ("adam", "0.01")])
def test_sync_rows_equal_one_process_after_200_steps(optimizer, lr):
    env = {"GRADSYNC_PS_MODE": "sync", "GRADSYNC_EMBEDDING_OPTIMIZER": optimizer,
           "GRADSYNC_EMBEDDING_LR": lr, "GRADSYNC_EMBEDDING_INIT_SCALE": "0.1",
           "STEPS": str(STEPS)}
    results = job.run_ok(WORKER, "train", WORKERS, torchrun=False,
                         servers=SERVERS, timeout_s=240, extra_env=env)
    r = results[0]
    assert all(v["steps"] == STEPS for v in results.values()), results
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
