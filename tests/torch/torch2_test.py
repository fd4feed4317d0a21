"""torch 2.x training-script patterns over the "gradsync" backend in real
4-process jobs started the way torchrun starts them (no agent that kills
the others when one fails): subgroups and a group's timeout, device
meshes, FSDP2 and HSDP against a one-process run, DDP's options and sparse
embeddings against gloo, torch.compile, bf16 autocast, DistributedSampler,
DCP, refused calls, and a barrier a rank never enters."""
import os

import job

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "torch2_worker.py")
WORKERS = 4
# float32 sums in another order (shards, ring chunks) than one process's.
FLOAT_NOISE = 1e-5


def run(scenario, *args, **kwargs):
    results = job.run_workers(scenario, [WORKER, scenario] + list(args),
                              WORKERS, **kwargs)
    for rank, (code, result, _) in results.items():
        assert code == 0 and result is not None, \
            "worker %d failed\n%s" % (rank, job.describe(results))
    return {rank: result for rank, (_, result, _) in results.items()}


def test_subgroups_and_a_groups_timeout():
    results = run("groups")
    for rank, r in results.items():
        assert r["backend"] == "gradsync" and r["pair_backend"] == "gradsync", r
        assert r["pair_sum"] == (3.0 if rank < 2 else 7.0), (rank, r)
        assert r["pair_rank"] == rank % 2, (rank, r)
        assert r["subgroup_sum"] == (1.0 if rank < 2 else 5.0), (rank, r)
        assert r["gathered"] == ([1.0, 3.0] if rank % 2 else [0.0, 2.0]), (rank, r)
        assert r["broadcast"] == (3.0 if rank % 2 else 2.0), (rank, r)
        assert r["world_sum"] == 4.0, (rank, r)
        assert r["after_destroy"] == 4.0, (rank, r)
    error = results[0]["timeout_error"]
    assert error is not None and "rank 1" in error, results[0]
    assert "all_reduce on rank 0 of 2" in error, error
    # The group's 3 s, not the default group's 30 minutes.
    assert results[0]["timeout_s"] < 60, results[0]


def test_a_refused_call_leaves_the_group_usable_and_missing_ops_are_named():
    for rank, r in run("refused").items():
        assert r["sparse_max"].startswith("RuntimeError: gradsync: all_reduce"), r
        assert r["after"] == [4.0, 4.0], r
        for op in ("send", "recv"):
            assert r[op].startswith("NotImplementedError") and \
                "not supported by gradsync" in r[op] and op in r[op], (op, r)
        assert r["batch_isend_irecv"] is not None and \
            "not supported by gradsync" in r["batch_isend_irecv"], r
        assert r["monitored_barrier"] is not None and \
            "monitored_barrier" in r["monitored_barrier"], r
        assert r["a2a"] == [10.0 * j + rank for j in range(WORKERS)], (rank, r)
        assert r["a2a_uneven"] == [float(j) for j in range(WORKERS)
                                   for _ in range(rank + 1)], (rank, r)
        assert r["a2a_list"] == [10.0 * j + rank for j in range(WORKERS)], r


def test_a_barrier_fails_naming_a_rank_that_ended_without_entering_it():
    results = run("barrier_exit")
    assert results[1]["left"], results[1]
    for rank in (0, 2, 3):
        error = results[rank]["error"]
        assert error is not None, (rank, results[rank])
        assert "worker 1" in error and "left the job" in error, error
        assert "barrier on rank %d of 4" % rank in error, error


def test_ddp_options_and_sparse_embeddings_equal_ddp_over_gloo():
    for rank, r in run("ddp_options").items():
        assert r["static_graph"] and r["bucket_view"] and r["find_unused"], r
        assert r["sparse"], r
        assert r["sparse_difference"] <= FLOAT_NOISE, (rank, r)


def test_fsdp2_and_hsdp_on_a_device_mesh_equal_one_process():
    for rank, r in run("fsdp2", timeout_s=240).items():
        assert r["sharded"] == "DTensor", r
        assert r["mesh_backends"] == ["gradsync", "gradsync"], r
        assert r["fsdp_difference"] <= FLOAT_NOISE, (rank, r)
        assert r["hsdp_difference"] <= FLOAT_NOISE, (rank, r)


def test_sampler_autocast_compile_and_dcp(tmp_path):
    for rank, r in run("script", str(tmp_path / "checkpoint"),
                       timeout_s=400).items():
        assert r["sampler_cover"] and r["sampler_reshuffled"], r
        assert r["amp_in_step"], r
        assert r["compile_difference"] <= FLOAT_NOISE, (rank, r)
        assert r["dcp_restored"], r
