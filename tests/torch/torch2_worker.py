"""One worker of a tests/torch job of what torch 2.x training scripts do
over the "gradsync" backend: subgroups and device meshes, FSDP2, DDP's
options, sparse embeddings without a hook, torch.compile, bf16 autocast,
DistributedSampler and torch.distributed.checkpoint. Runs the scenario
named by argv[1] and prints "RESULT <json>".

Started as torchrun starts its workers (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK) and nothing else."""
import copy
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gradsync  # noqa: F401  registers the backend
from worker import CLASSES, FEATURES, Bag, batch, embedding_steps, mlp, report

WORLD = 4


def init(**kwargs):
    dist.init_process_group("gradsync", **kwargs)
    return dist.get_rank(), dist.get_world_size()


def worst(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def groups():
    """new_group, new_subgroups and a group's own timeout."""
    rank, size = init()
    out = {"backend": dist.get_backend()}
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = pairs[rank // 2]
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=mine)
    out["pair_sum"] = t.item()
    out["pair_backend"] = dist.get_backend(mine)
    out["pair_rank"] = dist.get_rank(mine)
    # Subgroups of 2 by new_subgroups (every rank calls it), odd and even.
    sub, _ = dist.new_subgroups(group_size=2)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=sub)
    out["subgroup_sum"] = t.item()
    odd = dist.new_group([1, 3])
    even = dist.new_group([0, 2])
    gathered = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(gathered, torch.tensor([float(rank)]),
                    group=odd if rank % 2 else even)
    out["gathered"] = [g.item() for g in gathered]
    t = torch.tensor([float(rank)])
    dist.broadcast(t, src=3 if rank % 2 else 2, group=odd if rank % 2 else even)
    out["broadcast"] = t.item()
    # The whole world again after the subgroups.
    t = torch.ones(3)
    dist.all_reduce(t)
    out["world_sum"] = t[0].item()
    # A group with a 3 s timeout: rank 1 does not take part, rank 0 is told
    # within the timeout's reach, naming the missing rank.
    short = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=short)
            out["timeout_error"] = None
        except dist.DistBackendError as e:
            out["timeout_error"] = str(e)[:600]
        out["timeout_s"] = time.monotonic() - start
    if rank >= 2:
        dist.barrier(group=pairs[1])
    # Destroying subgroups closes their communicators; the world goes on.
    dist.destroy_process_group(odd if rank % 2 else even)
    dist.destroy_process_group(sub)
    t = torch.ones(1)
    dist.all_reduce(t)
    out["after_destroy"] = t.item()
    report(**out)


def refused():
    """A refused call raises at once and the group goes on; ops gradsync
    does not do are named."""
    rank, size = init()
    out = {}
    try:
        dist.all_reduce(torch.ones(2, 2).to_sparse(), op=dist.ReduceOp.MAX)
    except Exception as e:
        out["sparse_max"] = "%s: %s" % (type(e).__name__, e)
    t = torch.ones(2)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    dist.barrier()
    dist.barrier(device_ids=[0])
    for name, call in (("send", lambda: dist.send(torch.ones(1), (rank + 1) % size)),
                       ("recv", lambda: dist.recv(torch.ones(1), (rank + 1) % size)),
                       ("batch_isend_irecv", lambda: dist.batch_isend_irecv(
                           [dist.P2POp(dist.isend, torch.ones(1), (rank + 1) % size)])),
                       ("monitored_barrier", lambda: dist.monitored_barrier())):
        try:
            call()
            out[name] = None
        except Exception as e:
            out[name] = "%s: %s" % (type(e).__name__, str(e)[:300])
    # all_to_all_single, even and uneven splits.
    inp = torch.arange(size, dtype=torch.float32) + 10 * rank
    got = torch.zeros(size)
    dist.all_to_all_single(got, inp)
    out["a2a"] = got.tolist()
    in_splits = [r + 1 for r in range(size)]          # rank j gets j + 1 rows
    inp = torch.full((sum(in_splits), 2), float(rank))
    got = torch.zeros((size * (rank + 1), 2))
    dist.all_to_all_single(got, inp, [rank + 1] * size, in_splits)
    out["a2a_uneven"] = got[:, 0].tolist()
    outs = [torch.zeros(2) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * rank + j)) for j in range(size)])
    out["a2a_list"] = [o[0].item() for o in outs]
    dist.barrier()
    report(**out)


def barrier_exit():
    """Rank 1 ends normally without entering the barrier the others wait
    in: they fail naming it rather than pass."""
    rank, _ = init()
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        report(left=True)
        return
    start = time.monotonic()
    try:
        dist.barrier()
        report(error=None)
    except dist.DistBackendError as e:
        report(error=str(e)[:600], seconds=time.monotonic() - start)
    if rank == 0:
        # Rank 0 hosts the scheduler: it stops once the others have left
        # (each after its own barrier failed), not before.
        try:
            gradsync.shutdown(timeout_s=60)
        except gradsync.GradsyncError as e:  # the job failed, as it should
            print("shutdown: %s" % e, flush=True)


def ddp_options():
    """DDP with static_graph, gradient_as_bucket_view, find_unused_parameters
    and a sparse embedding (no hook) over gradsync, each against the same
    DDP over gloo: identical gradients."""
    rank, _ = init()
    gloo = dist.new_group(backend="gloo")
    out = {}
    variants = {"static_graph": dict(static_graph=True),
                "bucket_view": dict(gradient_as_bucket_view=True),
                "find_unused": dict(find_unused_parameters=True)}
    for name, kwargs in variants.items():
        ours = DistributedDataParallel(mlp(3, True), bucket_cap_mb=0.008, **kwargs)
        theirs = DistributedDataParallel(mlp(3, True), bucket_cap_mb=0.008,
                                         process_group=gloo, **kwargs)
        identical = True
        for step in range(4):
            x, y = batch(step, rank, 8, True)
            for model in (ours, theirs):
                model.zero_grad()
                if name == "find_unused" and step % 2:
                    # The last layer unused on odd steps.
                    h = model.module[:4](x)
                    h.sum().backward()
                else:
                    (model(x) * y).sum().backward()
            identical &= all(
                (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
                for a, b in zip(ours.parameters(), theirs.parameters()))
        out[name] = identical
    ours = DistributedDataParallel(Bag(True))
    theirs = DistributedDataParallel(Bag(True), process_group=gloo)
    diff, sparse = embedding_steps(ours, theirs, 3, rank)
    out["sparse"], out["sparse_difference"] = sparse, diff
    report(**out)
    dist.destroy_process_group()
    # torch 2.13's ~ProcessGroupGloo joins its run-loop thread with the GIL
    # held, while that thread may be waiting for the GIL to free its last
    # work (its ThreadLocalState holds a Python object): freeing the gloo
    # reference's objects deadlocks now and then.
    # gradsync leaves the job here as it does at exit, and the process ends
    # without freeing them.
    gradsync.shutdown(timeout_s=60)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _whole_batch(step, size, rows):
    xs, ys = zip(*(batch(step, r, rows) for r in range(size)))
    return torch.cat(xs), torch.cat(ys)


def _sgd_steps(model, steps, batch_of, lr=0.05):
    """`steps` SGD steps of mean squared error on batch_of(step)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = batch_of(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _train_alone(model, steps, size, rows):
    """The single-process run every data-parallel one must equal: the
    whole batch (every rank's rows) in one process."""
    _sgd_steps(model, steps, lambda step: _whole_batch(step, size, rows))
    return [p.detach().clone() for p in model.parameters()]


def _fsdp_steps(model, steps, rank, rows):
    _sgd_steps(model, steps, lambda step: batch(step, rank, rows))


def _full(model):
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def fsdp2():
    """fully_shard over the gradsync world (all-gather and reduce-scatter
    of real shards), then HSDP over a 2 x 2 DeviceMesh (replicate x shard,
    both dimensions over gradsync): each equals a one-process run."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    rank, size = init()
    out = {}
    reference = _train_alone(mlp(7), 3, size, 4)
    model = mlp(7)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    out["sharded"] = type(next(model.parameters())).__name__
    _fsdp_steps(model, 3, rank, 4)
    out["fsdp_difference"] = worst(_full(model), reference)

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    out["mesh_backends"] = [dist.get_backend(mesh.get_group(d))
                            for d in ("replicate", "shard")]
    hsdp = mlp(7)
    for layer in hsdp:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(hsdp, mesh=mesh)
    _fsdp_steps(hsdp, 3, rank, 4)
    out["hsdp_difference"] = worst(_full(hsdp), reference)
    report(**out)
    dist.destroy_process_group()


def script():
    """A torch 2.x training script's habits: DistributedSampler with
    set_epoch, bf16 autocast, a torch.compile'd model under DDP, and a DCP
    checkpoint saved and loaded over the gradsync group."""
    import torch.distributed.checkpoint as dcp
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    rank, size = init()
    out = {}
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, FEATURES), torch.randn(64, CLASSES))
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen.append(list(iter(sampler)))
    every = [None] * size
    dist.all_gather_object(every, seen)
    out["sampler_cover"] = all(sorted(sum((e[k] for e in every), [])) ==
                               list(range(64)) for k in range(2))
    out["sampler_reshuffled"] = seen[0] != seen[1]

    model = DistributedDataParallel(mlp(11))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = [p.detach() for p in model.parameters()]
    gathered = [torch.zeros_like(params[0]) for _ in range(size)]
    dist.all_gather(gathered, params[0])
    out["amp_in_step"] = all(torch.equal(g, gathered[0]) for g in gathered)

    # torch.compile under DDP: the same gradients as eager within noise.
    eager = DistributedDataParallel(mlp(12))
    compiled = torch.compile(DistributedDataParallel(mlp(12)))
    x, y = batch(0, rank, 8)
    for m in (eager, compiled):
        torch.nn.functional.mse_loss(m(x), y).backward()
    out["compile_difference"] = worst(
        [p.grad for p in eager.parameters()],
        [p.grad for p in compiled.parameters()])

    # DCP: save the DDP model and optimizer, change them, load them back.
    directory = sys.argv[2]
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.save(state, checkpoint_id=directory)
    saved = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=directory)
    model.load_state_dict(state["model"])
    out["dcp_restored"] = all(torch.equal(saved[k], v)
                              for k, v in model.state_dict().items())
    report(**out)
    dist.destroy_process_group()


SCENARIOS = {
    "groups": groups,
    "refused": refused,
    "barrier_exit": barrier_exit,
    "ddp_options": ddp_options,
    "fsdp2": fsdp2,
    "script": script,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    SCENARIOS[sys.argv[1]]()
