"""Bad settings raise a clear error before any training (a one-worker job
in this process, joined as under torchrun)."""
import os

import pytest
import torch

import gradsync
import gradsync.torch as gst
import job


@pytest.fixture
def torchrun_env(monkeypatch):
    for key, value in job.base_env().items():
        monkeypatch.setenv(key, value)
    for key in ("GRADSYNC_SCHEDULER", "GRADSYNC_RANK", "GRADSYNC_NUM_WORKERS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(job.master_port()))
    yield
    gradsync.shutdown()


def test_no_job_to_join(monkeypatch):
    for key in ("GRADSYNC_SCHEDULER", "RANK", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(gradsync.GradsyncError, match="no job to join"):
        gradsync.init()


def test_unknown_setting_is_named(torchrun_env):
    with pytest.raises(gradsync.GradsyncError,
                       match="unknown setting --bucket_byts") as e:
        gradsync.init(bucket_byts=4096)
    assert e.value.code == "invalid_argument"
    assert not gradsync.is_initialized()


def test_bad_compression_is_named(torchrun_env):
    with pytest.raises(gradsync.GradsyncError, match="bogus"):
        gradsync.init(compression="bogus")


def test_unreachable_scheduler_fails_in_time(monkeypatch):
    monkeypatch.setenv("GRADSYNC_METRICS_BASE_PORT", "0")
    port = job.free_port()
    with pytest.raises(gradsync.GradsyncError, match="127.0.0.1:%d" % port):
        gradsync.init(timeout_s=10, scheduler="127.0.0.1:%d" % port,
                      num_workers=2, connect_timeout_ms=1000)


def test_torchrun_world_of_one(torchrun_env):
    comm = gradsync.init()
    assert (gradsync.rank(), gradsync.size(), gradsync.local_rank()) == (0, 1, 0)
    with pytest.raises(gradsync.GradsyncError, match="already called"):
        gradsync.init()
    t = torch.arange(5, dtype=torch.float32)
    gst.allreduce(t)
    assert t.tolist() == [0, 1, 2, 3, 4]
    assert comm.stats()["steps"] == 0


def model():
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def test_optimizer_arguments_refused_before_training(torchrun_env):
    gradsync.init()
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        gst.DistributedOptimizer(sgd, m.named_parameters(),
                                 backward_passes_per_step=0)
    named = list(m.named_parameters())
    with pytest.raises(ValueError, match=r"names \['0.bias'\] more than once"):
        gst.DistributedOptimizer(sgd, named + [named[1]])
    with pytest.raises(ValueError, match="lacks 2 of the optimizer's"):
        gst.DistributedOptimizer(sgd, named[:2])


def test_tensors_gradsync_cannot_take(torchrun_env):
    gradsync.init()
    on_meta = torch.nn.Parameter(torch.zeros(3, device="meta"))
    with pytest.raises(gradsync.GradsyncError,
                       match="gradsync takes CPU and CUDA tensors"):
        gst.DistributedOptimizer(torch.optim.SGD([on_meta], lr=0.1),
                                 [("w", on_meta)])
    doubles = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(gradsync.GradsyncError, match="'w' is torch.float64"):
        gst.DistributedOptimizer(torch.optim.SGD([doubles], lr=0.1),
                                 [("w", doubles)])
    with pytest.raises(gradsync.GradsyncError, match="HookState"):
        gst.allreduce_hook(None, None)


def test_gradient_twice_before_step(torchrun_env):
    gradsync.init()
    m = model()
    opt = gst.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   m.named_parameters())
    m(torch.ones(1, 4)).sum().backward()
    with pytest.raises(gradsync.GradsyncError, match="produced again"):
        m(torch.ones(1, 4)).sum().backward()


def test_cuda_gradients_need_a_cuda_build(torchrun_env):
    """This build has no CUDA: asking for CUDA gradients fails at init with
    a message that says so, and a CUDA-less communicator names the setting
    when handed a CUDA tensor."""
    if os.environ.get("GRADSYNC_TEST_CUDA_BUILD"):
        pytest.skip("gradsync under test was built with CUDA")
    with pytest.raises(gradsync.GradsyncError, match="built without CUDA"):
        gradsync.init(gradient_device="cuda")
