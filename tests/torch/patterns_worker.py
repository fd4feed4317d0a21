"""One worker of a tests/torch job running a pattern of real training
scripts with gradsync.torch.DistributedOptimizer (clipping, a skipped
overflow step, LR schedulers, two optimizers, unused parameters,
channels_last, checkpoint resume, a model of 10,000 long-named
parameters); prints "RESULT <json>"."""
import os
import sys

import torch

import gradsync
import gradsync.torch as gst
from worker import Bag, batch, mlp, report

ROWS, STEPS = 8, 4


def local_batches(rank, size, steps=STEPS):
    """(this rank's rows, the whole batch) of each step."""
    full = [batch(s, 0, ROWS * size) for s in range(steps)]
    return [((x[rank * ROWS:(rank + 1) * ROWS], y[rank * ROWS:(rank + 1) * ROWS]),
             (x, y)) for x, y in full]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def difference(a, b):
    return max((pa - pb).abs().max().item()
               for pa, pb in zip(a.parameters(), b.parameters()))


def clip_and_schedule():
    """Horovod's recipe: synchronize(), clip, step() inside
    skip_synchronize(), with a StepLR on the wrapper; equals one process
    clipping the whole batch's gradient."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    model, reference = mlp(7), mlp(7)
    opt = gst.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)
              for o in (opt, ref_opt)]
    for (x, y), (fx, fy) in local_batches(rank, size):
        loss_of(model, x, y).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
        loss_of(reference, fx, fy).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        ref_opt.step()
        for o, s in zip((opt, ref_opt), scheds):
            o.zero_grad()
            s.step()
    report(max_difference=difference(model, reference),
           moved=difference(model, mlp(7)),
           is_optimizer=isinstance(opt, torch.optim.Optimizer),
           lr=opt.param_groups[0]["lr"], steps=opt.comm.stats()["steps"])
    gradsync.shutdown()


def overflow_step():
    """Rank 1's loss overflows in step 1: every rank sees inf/NaN after
    synchronize() and skips the step (GradScaler's way); with top-k and
    error feedback the later steps' gradients stay finite."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    model = mlp(7)
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    skipped, finite_after = [], True
    for step, ((x, y), _) in enumerate(local_batches(rank, size, 5)):
        loss = loss_of(model, x, y)
        if step == 1 and rank == 1:
            loss = loss * float("inf")
        loss.backward()
        opt.synchronize()
        found_inf = not all(bool(torch.isfinite(p.grad).all())
                            for p in model.parameters())
        if found_inf:
            skipped.append(step)
        else:
            with opt.skip_synchronize():
                opt.step()
            finite_after &= step < 1 or all(bool(torch.isfinite(p).all())
                                            for p in model.parameters())
        opt.zero_grad()
    report(skipped=skipped, finite_after=finite_after,
           checksum=sum(float(p.double().sum()) for p in model.parameters()))
    gradsync.shutdown()


class Pair(torch.nn.Module):
    """A generator-and-critic pair of small networks."""

    def __init__(self, seed):
        super().__init__()
        self.g, self.d = mlp(seed), mlp(seed + 1)


def two_optimizers():
    """Two DistributedOptimizers in one process (a GAN's loop): each steps
    its own network; equals one process on the whole batch."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    ours, ref = Pair(3), Pair(3)
    opts = [gst.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                     named_parameters=m.named_parameters())
            for m in (ours.g, ours.d)]
    refs = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ref.g, ref.d)]
    for (x, y), (fx, fy) in local_batches(rank, size):
        for net, opt, xs, ys in ((ours.g, opts[0], x, y), (ours.d, opts[1], x, -y)):
            loss_of(net, xs, ys).backward()
            opt.step()
            opt.zero_grad()
        for net, opt, xs, ys in ((ref.g, refs[0], fx, fy), (ref.d, refs[1], fx, -fy)):
            loss_of(net, xs, ys).backward()
            opt.step()
            opt.zero_grad()
    report(max_difference=difference(ours, ref), moved=difference(ours, Pair(3)))
    gradsync.shutdown()


class WithSpare(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = mlp(7)
        self.spare = torch.nn.Linear(4, 4)


def unused_everywhere():
    """A parameter no rank uses keeps grad=None and is not moved, though
    the optimizer has momentum and weight decay."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    model = WithSpare()
    before = model.spare.weight.detach().clone()
    opt = gst.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                        weight_decay=0.1),
        named_parameters=model.named_parameters())
    for (x, y), _ in local_batches(rank, size):
        loss_of(model.used, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    report(grad_none=model.spare.weight.grad is None,
           moved=(model.spare.weight - before).abs().max().item(),
           used_moved=difference(model.used, mlp(7)))
    gradsync.shutdown()


def conv_net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3),
        torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))


def channels_last():
    """A channels_last convolutional model trains through the optimizer
    and equals one process on the whole batch."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    model = conv_net(2).to(memory_format=torch.channels_last)
    reference = conv_net(2)
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(3):
        torch.manual_seed(500 + step)
        fx, fy = torch.randn(ROWS * size, 3, 8, 8), torch.randn(ROWS * size, 3)
        x = fx[rank * ROWS:(rank + 1) * ROWS].to(memory_format=torch.channels_last)
        loss_of(model, x, fy[rank * ROWS:(rank + 1) * ROWS]).backward()
        opt.step()
        opt.zero_grad()
        loss_of(reference, fx, fy).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    report(max_difference=difference(model, reference),
           channels_last=model[0].weight.is_contiguous(
               memory_format=torch.channels_last))
    gradsync.shutdown()


def checkpoint_resume():
    """Rank 0 loads a checkpoint (model with BatchNorm, Adam state); the
    others start fresh; after broadcast_parameters and
    broadcast_optimizer_state every rank holds rank 0's parameters, buffers
    and optimizer state, and one more synchronised step keeps the
    parameters and state equal (running stats follow each rank's batch)."""
    gradsync.init()
    rank = gradsync.rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16),
                                torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 6))
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    if rank == 0:
        for step in range(3):  # the run the checkpoint came from
            x, y = batch(step, 0, 8)
            loss_of(model, x, y).backward()
            adam.step()
            adam.zero_grad()
        path = os.path.join(os.environ["CHECKPOINT_DIR"], "ckpt.pt")
        torch.save({"model": model.state_dict(), "opt": adam.state_dict()}, path)
        loaded = torch.load(path)
        model.load_state_dict(loaded["model"])
        adam.load_state_dict(loaded["opt"])
    opt = gst.DistributedOptimizer(adam, named_parameters=model.named_parameters())
    gst.broadcast_parameters(model.state_dict(), root_rank=0)
    gst.broadcast_optimizer_state(opt, root_rank=0)
    # A tensor with gaps (a transposed view) and an integer one, each
    # different on every rank, go through a CPU copy.
    base = torch.arange(24, dtype=torch.int64).reshape(4, 6) * (rank + 1)
    view = base.t()[1:5]
    gst.broadcast_parameters([("view", view)], root_rank=0)
    # Parameters and BatchNorm buffers (running stats, batch count).
    resumed = [float(t.double().sum()) for t in model.state_dict().values()]
    resumed.append(float(view.double().sum()))
    x, y = batch(9, rank, 8)
    loss_of(model, x, y).backward()
    opt.step()
    state = opt.state_dict()["state"]
    report(resumed=resumed,
           params=[float(p.double().sum()) for p in model.parameters()],
           state=[float(v.double().sum()) for s in state.values()
                  for v in s.values()],
           step=[float(s["step"]) for s in state.values()])
    gradsync.shutdown()


def sparse_embedding():
    """nn.Embedding(sparse=True) through DistributedOptimizer (plain SGD,
    which takes sparse gradients): equals one process with a dense
    embedding on the whole batch."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    model, reference = Bag(True), Bag(False)
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    sparse_seen = False
    for step in range(4):
        torch.manual_seed(100 + step)
        ids = torch.randint(0, 50, (6 * size, 4))
        loss = model(ids[rank * 6:(rank + 1) * 6]).sum() / 6
        loss.backward()
        sparse_seen |= model.embedding.weight.grad.is_sparse
        opt.step()
        opt.zero_grad()
        (reference(ids).sum() / (6 * size)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    report(max_difference=difference(model, reference), sparse=sparse_seen,
           moved=difference(model, Bag(False)))
    gradsync.shutdown()


def large_model():
    """10,000 parameters named by 100-character paths train through the
    optimizer's buckets: every rank's gradient is its rank + 1, so each
    parameter moves by -lr * the average (2.5 with 4 ranks)."""
    gradsync.init()
    rank = gradsync.rank()
    prefix = "encoder.layers." + "x" * 70 + ".block."
    named = [("%s%08d.w" % (prefix, i), torch.nn.Parameter(torch.zeros(3)))
             for i in range(10000)]
    assert all(len(n) >= 100 for n, _ in named)
    params = [p for _, p in named]
    opt = gst.DistributedOptimizer(torch.optim.SGD(params, lr=1.0),
                                   named_parameters=named)
    for _ in range(2):
        (torch.cat(params) * (rank + 1)).sum().backward()
        opt.step()
        opt.zero_grad()
    values = torch.cat([p.detach() for p in params]).unique().tolist()
    report(values=values, steps=opt.comm.stats()["steps"])
    gradsync.shutdown()


SCENARIOS = {
    "clip": clip_and_schedule,
    "overflow": overflow_step,
    "two_optimizers": two_optimizers,
    "unused_everywhere": unused_everywhere,
    "channels_last": channels_last,
    "checkpoint": checkpoint_resume,
    "large_model": large_model,
    "sparse": sparse_embedding,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    SCENARIOS[sys.argv[1]]()
