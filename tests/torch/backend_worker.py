"""One worker of a tests/torch job over the "gradsync" torch.distributed
backend: runs the scenario named by argv[1] and prints "RESULT <json>".

Started as torchrun starts its workers (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK) and nothing else: no gloo group unless the
scenario makes one to compare with, and no launcher that kills the others
when one fails."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gradsync
import gradsync.torch as gst
from worker import Bag, batch, die_now, embedding_steps, mlp, report

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64,
          torch.int32, torch.int64, torch.uint8, torch.bool]
OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}


def end_without_freeing_gloo():
    """Ends a scenario that made a gloo group, before its objects are freed:
    torch 2.13's ~ProcessGroupGloo joins its run-loop thread with the GIL
    held, while that thread may wait for the GIL to free its last work, so
    freeing them deadlocks now and then. gradsync leaves the job as it does
    at exit, and the process ends."""
    gradsync.shutdown(timeout_s=60)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def values(dtype, rank, n=37):
    """Small integers (exact in every dtype): rank-dependent, some zeros."""
    torch.manual_seed(50 + rank)
    t = torch.randint(-3, 4, (n,))
    if dtype == torch.bool:
        return t > 0
    if dtype == torch.uint8:
        return t.abs().to(dtype)
    return t.to(dtype)


def compare(name, ours, theirs, mismatches):
    if ours.dtype != theirs.dtype or not torch.equal(ours, theirs):
        mismatches.append("%s: %s vs %s" % (name, ours.tolist()[:8],
                                            theirs.tolist()[:8]))


def expected(name, dtype, rank, size):
    """What `name` leaves on `rank`, computed from every rank's values."""
    every = torch.stack([values(dtype, r) for r in range(size)])
    wide = every.to(torch.int64)
    reduced = {"all_reduce_sum": lambda: wide.sum(0),
               "all_reduce_min": lambda: wide.amin(0),
               "all_reduce_max": lambda: wide.amax(0),
               "all_reduce_product": lambda: wide.prod(0),
               "broadcast": lambda: wide[1],
               "all_gather": lambda: wide,
               "all_gather_into_tensor": lambda: wide.reshape(-1)}[name]()
    return reduced != 0 if dtype == torch.bool else reduced.to(dtype)


def run_collective(name, op, dtype, rank, size, group):
    t = values(dtype, rank)
    if name.startswith("all_reduce"):
        dist.all_reduce(t, op=op, group=group)
        return t
    if name == "broadcast":
        t = t if rank == 1 else torch.zeros(37).to(dtype)
        dist.broadcast(t, src=1, group=group)
        return t
    if name == "all_gather":
        parts = [torch.zeros(37).to(dtype) for _ in range(size)]
        dist.all_gather(parts, t, group=group)
        return torch.stack(parts)
    whole = torch.zeros(37 * size).to(dtype)
    dist.all_gather_into_tensor(whole, t, group=group)
    return whole


def reference(name, op, dtype, rank, size, group):
    """gloo's result where gloo takes the dtype and operation, else the
    result computed here; and which of the two it is."""
    try:
        return run_collective(name, op, dtype, rank, size, group), "gloo"
    except RuntimeError:
        return expected(name, dtype, rank, size), "computed"


def collectives_pair(group, rank, size, dtype):
    """Every collective on both groups; {name: (gradsync's, reference)}."""
    names = [("all_reduce_" + n, op) for n, op in OPS.items()] + \
        [(n, None) for n in ("broadcast", "all_gather",
                             "all_gather_into_tensor")]
    out = {}
    for name, op in names:
        ours = run_collective(name, op, dtype, rank, size, None)
        out[name] = (ours,) + reference(name, op, dtype, rank, size, group)
    return out


def collectives():
    """Every collective over gradsync against the same over a gloo group
    made beside it, on every dtype: identical results."""
    dist.init_process_group("gradsync")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    mismatches, checked, against_gloo = [], 0, 0
    for dtype in DTYPES:
        for name, (ours, theirs, source) in collectives_pair(
                gloo, rank, size, dtype).items():
            compare("%s %s" % (name, dtype), ours, theirs, mismatches)
            checked += 1
            against_gloo += source == "gloo"
    # reduce_scatter: gloo has none in torch 1.13; the expected slice is
    # the sum of every rank's inputs, computed here.
    for dtype in (torch.float32, torch.int64):
        inputs = [values(dtype, rank) + i for i in range(size)]
        out = torch.zeros(37).to(dtype)
        dist.reduce_scatter(out, inputs)
        expected = sum(values(dtype, r) + rank for r in range(size))
        compare("reduce_scatter %s" % dtype, out, expected.to(dtype), mismatches)
        whole = torch.cat(inputs)
        out2 = torch.zeros(37).to(dtype)
        dist.reduce_scatter_tensor(out2, whole)
        compare("reduce_scatter_tensor %s" % dtype, out2, expected.to(dtype),
                mismatches)
        checked += 2
    avg = torch.full((5,), float(rank))
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    compare("all_reduce_avg", avg, torch.full((5,), (size - 1) / 2), mismatches)
    dist.barrier()
    work = dist.all_reduce(torch.ones(3), async_op=True)
    work.wait()
    report(mismatches=mismatches, checked=checked + 2, gloo=against_gloo,
           backend=dist.get_backend(), completed=work.is_completed())
    dist.destroy_process_group()
    end_without_freeing_gloo()


def ddp_vs_gloo(hook, view=False):
    """DDP over the gradsync group (no hook, or gradsync's hook with the
    given compression) against DDP over a gloo group, on integer-valued
    gradients: the same gradients bit for bit (fp16 too: small integers).
    `view`: both with gradient_as_bucket_view (the gradients are views into
    DDP's buckets, which the hook gets)."""
    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    gloo_group = dist.new_group(backend="gloo")
    torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 4096
    gloo = DistributedDataParallel(mlp(1, True), bucket_cap_mb=0.008,
                                   process_group=gloo_group,
                                   gradient_as_bucket_view=view)
    ours = DistributedDataParallel(mlp(1, True), bucket_cap_mb=0.008,
                                   gradient_as_bucket_view=view)
    if hook:
        ours.register_comm_hook(gst.HookState(), gst.allreduce_hook)
    identical = True
    for step in range(5):
        x, y = batch(step, rank, 16, True)
        for model in (gloo, ours):
            model.zero_grad()
            (model(x) * y).sum().backward()
        identical &= all(torch.equal(a.grad, b.grad) for a, b in
                         zip(gloo.parameters(), ours.parameters()))
    report(identical=identical, backend=dist.get_backend(),
           steps=gradsync.communicator().stats()["steps"])
    dist.destroy_process_group()
    end_without_freeing_gloo()


def killed(hook):
    """Rank 3 dies (SIGKILL) in its step-3 backward pass; every other rank
    must raise from backward() (or the step's wait) naming the cause."""
    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    model = DistributedDataParallel(mlp(5), bucket_cap_mb=0.008)
    if hook:
        model.register_comm_hook(gst.HookState(), gst.allreduce_hook)
    for step in range(100):
        x, y = batch(step, rank, 8)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == 3 and rank == 3:
            die_now()
        try:
            loss.backward()
        except RuntimeError as e:
            report(error=str(e)[:2000], step=step, at=time.time())
            os._exit(0)  # the job is gone: leave without the exit handshake
    report(error=None)


def sparse_hook():
    """nn.Embedding(sparse=True) through DDP + gradsync's hook: after each
    backward the embedding's gradient equals the dense average of every
    rank's dense gradient (computed from a dense twin with gloo)."""
    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    gloo_group = dist.new_group(backend="gloo")
    ours = DistributedDataParallel(Bag(True))
    ours.register_comm_hook(gst.HookState(), gst.allreduce_hook)
    dense = DistributedDataParallel(Bag(False), process_group=gloo_group)
    worst, sparse_seen = embedding_steps(ours, dense, 4, rank)
    report(max_difference=worst, sparse=sparse_seen)
    dist.destroy_process_group()
    end_without_freeing_gloo()


def two_hooked_models():
    """Two DDP models with gradsync's hook in one process (a GAN's loop):
    each equals its twin over gloo, bit for bit on integer gradients."""
    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    gloo_group = dist.new_group(backend="gloo")
    pairs = []
    for seed in (1, 2):
        gloo = DistributedDataParallel(mlp(seed, True), process_group=gloo_group)
        ours = DistributedDataParallel(mlp(seed, True))
        ours.register_comm_hook(gst.HookState(), gst.allreduce_hook)
        pairs.append((gloo, ours))
    identical = True
    for step in range(5):
        x, y = batch(step, rank, 16, True)
        for gloo, ours in pairs:
            for model in (gloo, ours):
                model.zero_grad()
                (model(x) * y).sum().backward()
            identical &= all(torch.equal(a.grad, b.grad) for a, b in
                             zip(gloo.parameters(), ours.parameters()))
    report(identical=identical)
    dist.destroy_process_group()
    end_without_freeing_gloo()


SCENARIOS = {
    "two_hooks": two_hooked_models,
    "collectives": collectives,
    "ddp": lambda: ddp_vs_gloo(False),
    "ddp_hook": lambda: ddp_vs_gloo(True),
    "ddp_hook_view": lambda: ddp_vs_gloo(True, view=True),
    "killed": lambda: killed(False),
    "killed_hook": lambda: killed(True),
    "sparse_hook": sparse_hook,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    SCENARIOS[sys.argv[1]]()
