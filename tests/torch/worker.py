"""One worker of a tests/torch job: runs the scenario named by argv[1] and
prints its findings as one line "RESULT <json>".

Launched by torch_job_test.py, four at a time, with the environment torchrun
sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) or that of
gradsync_launch (GRADSYNC_SCHEDULER, ...)."""
import json
import os
import signal
import sys
import threading
import time
import warnings

import torch
from torch.nn.parallel import DistributedDataParallel

import gradsync
import gradsync.torch as gst

FEATURES, HIDDEN, CLASSES = 12, 48, 6


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def mlp(seed, integer=False):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES))
    if integer:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randint(-2, 3, p.shape).float())
    return model


class Bag(torch.nn.Module):
    """An embedding bag (sparse or dense gradients) and a linear head."""

    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(4)
        self.embedding = torch.nn.Embedding(50, 8, sparse=sparse)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(1))


def embedding_steps(ours, theirs, steps, rank):
    """`steps` backward passes of two Bag models on the same ids: the
    largest difference between their embedding (as dense) and head
    gradients, and whether ours's embedding gradient was sparse."""
    worst, sparse = 0.0, False
    for step in range(steps):
        torch.manual_seed(100 + 10 * step + rank)
        ids = torch.randint(0, 50, (6, 4))
        for model in (ours, theirs):
            model.zero_grad()
            model(ids).sum().backward()
        a = ours.module.embedding.weight.grad
        b = theirs.module.embedding.weight.grad
        sparse |= a.is_sparse
        worst = max(worst, (a.to_dense() - b.to_dense()).abs().max().item(),
                    (ours.module.head.weight.grad -
                     theirs.module.head.weight.grad).abs().max().item())
    return worst, sparse


def batch(step, rank, rows, integer=False):
    """This rank's rows of step `step`'s batch."""
    torch.manual_seed(1000 + 10 * step + rank)
    if integer:
        return (torch.randint(-2, 3, (rows, FEATURES)).float(),
                torch.randint(-1, 2, (rows, CLASSES)).float())
    return torch.randn(rows, FEATURES), torch.randn(rows, CLASSES)


def max_difference(a, b):
    """Largest |a - b| over the gradients, relative to max(1, |a|)."""
    worst = 0.0
    for pa, pb in zip(a.parameters(), b.parameters()):
        scale = max(1.0, pa.grad.abs().max().item())
        worst = max(worst, (pa.grad - pb.grad).abs().max().item() / scale)
    return worst


def hook_vs_gloo(mode):
    """The same DDP model twice: once with gloo's all-reduce, once with
    gradsync's comm hook; their averaged gradients after each step."""
    integer = mode == "integer"
    gradsync.init(first_bucket_bytes=2048, bucket_bytes=8192)
    gst.init_process_group("gloo")
    rank = gradsync.rank()
    # DDP's knob for the first bucket after its rebuild: several buckets.
    torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 4096
    gloo = DistributedDataParallel(mlp(1, integer), bucket_cap_mb=0.008)
    ours = DistributedDataParallel(mlp(1, integer), bucket_cap_mb=0.008)
    state = gst.HookState()
    ours.register_comm_hook(state, gst.allreduce_hook)
    differences, identical = [], True
    for step in range(6):
        x, y = batch(step, rank, 16, integer)
        for model in (gloo, ours):
            model.zero_grad()
            (model(x) * y).sum().backward()
        differences.append(max_difference(gloo, ours))
        identical &= all(torch.equal(a.grad, b.grad) for a, b in
                         zip(gloo.parameters(), ours.parameters()))
    report(differences=differences, identical=identical,
           registered=state.registered, buckets=len(state._ids),
           stats=gradsync.communicator().stats())
    gradsync.shutdown()


def regression_steps(model, opt, batches, passes):
    """Trains `model` on each batch, split into `passes` micro-batches."""
    for x, y in batches:
        for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
            loss = torch.nn.functional.mse_loss(model(xs), ys) / passes
            loss.backward()
        opt.step()
        opt.zero_grad()


def optimizer_vs_single(accumulation):
    """k steps of DistributedOptimizer on 4 workers against one process
    stepping on the whole batch; `accumulation`: none, passes (two backward
    passes per step) or no_sync."""
    gradsync.init(first_bucket_bytes=2048, bucket_bytes=8192)
    rank, size = gradsync.rank(), gradsync.size()
    rows, steps = 8, 4
    full = [batch(s, 0, rows * size) for s in range(steps)]
    local = [(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
             for x, y in full]
    model = mlp(rank + 7)  # different starts: the broadcast must fix them
    gst.broadcast_parameters(model.state_dict(), root_rank=0)
    reference = mlp(7)
    passes = 1 if accumulation == "none" else 2
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = gst.DistributedOptimizer(
        sgd, named_parameters=model.named_parameters(),
        backward_passes_per_step=2 if accumulation == "passes" else 1)
    if accumulation == "no_sync":
        regression_no_sync(model, opt, local)
    else:
        regression_steps(model, opt, local, passes)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    regression_steps(reference, ref_opt, full, 1)
    worst = max((a - b).abs().max().item() for a, b in
                zip(model.parameters(), reference.parameters()))
    moved = max((a - b).abs().max().item() for a, b in
                zip(model.parameters(), mlp(7).parameters()))
    report(max_difference=worst, moved=moved, steps=opt.comm.stats()["steps"])
    gradsync.shutdown()


def regression_no_sync(model, opt, batches):
    """As regression_steps with two micro-batches, the first in no_sync."""
    for x, y in batches:
        (x1, x2), (y1, y2) = x.chunk(2), y.chunk(2)
        with opt.no_sync():
            (torch.nn.functional.mse_loss(model(x1), y1) / 2).backward()
        (torch.nn.functional.mse_loss(model(x2), y2) / 2).backward()
        opt.step()
        opt.zero_grad()


class Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.trunk = torch.nn.Linear(FEATURES, CLASSES)
        self.branch = torch.nn.Linear(FEATURES, CLASSES)

    def forward(self, x, use_branch):
        out = self.trunk(x)
        return out + self.branch(x) if use_branch else out


def server_optimizer():
    """The shards hold the parameters and step (plain SGD, lr 0.05): k steps
    equal one process stepping on the whole batch from rank 0's start."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    rows, steps = 8, 4
    full = [batch(s, 0, rows * size) for s in range(steps)]
    local = [(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
             for x, y in full]
    model = mlp(rank + 7)
    unused = torch.optim.SGD(model.parameters(), lr=0.0)
    opt = gst.DistributedOptimizer(unused,
                                   named_parameters=model.named_parameters())
    regression_steps(model, opt, local, 1)
    reference = mlp(7)
    regression_steps(reference, torch.optim.SGD(reference.parameters(),
                                                lr=0.05), full, 1)
    worst = max((a - b).abs().max().item() for a, b in
                zip(model.parameters(), reference.parameters()))
    report(max_difference=worst, steps=opt.comm.stats()["steps"])
    gradsync.shutdown()


def optimizer_state():
    """Every rank's Adam has other state and learning rate; after the
    broadcasts all hold rank 0's."""
    gradsync.init()
    rank = gradsync.rank()
    model = mlp(rank)
    adam = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    for step in range(rank + 1):
        x, y = batch(step, rank, 8)
        torch.nn.functional.mse_loss(model(x), y).backward()
        adam.step()
        adam.zero_grad()
    gst.broadcast_parameters(model.state_dict(), root_rank=0)
    gst.broadcast_optimizer_state(adam, root_rank=0)
    state = adam.state_dict()
    tensors = [v for s in state["state"].values() for v in s.values()]
    report(lr=state["param_groups"][0]["lr"],
           state=[float(t.double().sum()) for t in tensors],
           params=[float(p.double().sum()) for p in model.parameters()])
    gradsync.shutdown()


def unused_parameter():
    """Only rank 0 takes the branch: the step must not hang, and the branch's
    averaged gradient is rank 0's divided by the world size."""
    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    model = Branches()
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    worst, started = 0.0, time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            x, _ = batch(step, rank, 4)
            model(x, use_branch=rank == 0).sum().backward()
            opt.synchronize()
            x0, _ = batch(step, 0, 4)
            expected = x0.sum(0).expand(CLASSES, FEATURES) / size
            worst = max(worst, (model.branch.weight.grad - expected).abs().max().item())
            opt.zero_grad(set_to_none=True)
    warned = [str(w.message) for w in caught if "gradsync" in str(w.message)]
    report(max_difference=worst, unused=opt.unused_gradients, warnings=warned,
           seconds=time.monotonic() - started)
    gradsync.shutdown()


def dtypes():
    """fp32, fp16 and bf16 parameters: rank r's gradient is r + 1 everywhere;
    the average of 1..4 is 2.5 in every dtype."""
    gradsync.init()
    rank = gradsync.rank()
    params = [torch.nn.Parameter(torch.zeros(300, dtype=d))
              for d in (torch.float32, torch.float16, torch.bfloat16)]
    opt = gst.DistributedOptimizer(
        torch.optim.SGD(params, lr=1.0),
        named_parameters=[("p_%s" % str(p.dtype)[6:], p) for p in params])
    for _ in range(2):
        sum((p.float() * (rank + 1)).sum() for p in params).backward()
        opt.step()
        opt.zero_grad()
    report(values=[p.float().unique().tolist() for p in params])
    gradsync.shutdown()


def gil_released():
    """While rank 0 waits in step() for rank 3 (which sleeps 1 s before its
    backward pass), a Python thread of rank 0 keeps running: gradsync's
    wait holds no GIL."""
    gradsync.init()
    rank = gradsync.rank()
    model = mlp(5)
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    x, y = batch(0, rank, 8)
    if rank == 3:
        time.sleep(1.0)  # its gradients come a second late
    torch.nn.functional.mse_loss(model(x), y).backward()
    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    started = time.monotonic()
    counter.start()
    opt.step()
    waited = time.monotonic() - started
    stop.set()
    counter.join()
    report(ticks=ticks[0], waited=waited)
    gradsync.shutdown()


def die_now():
    """SIGKILLs this process after writing the time to KILL_TIME_FILE."""
    with open(os.environ["KILL_TIME_FILE"], "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def killed():
    """Rank 3 dies (SIGKILL) in the middle of step 3; every other rank must
    raise a GradsyncError naming it."""
    gradsync.init()
    rank = gradsync.rank()
    model = mlp(5)
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    for step in range(100):
        x, y = batch(step, rank, 8)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == 3 and rank == 3:
            die_now()
        loss.backward()
        try:
            opt.step()
        except gradsync.GradsyncError as e:
            report(error=str(e), code=e.code, step=step, at=time.time())
            gradsync.shutdown(timeout_s=1.0)
            return
        opt.zero_grad()
    report(error=None)


SCENARIOS = {
    "hook_integer": lambda: hook_vs_gloo("integer"),
    "hook_float": lambda: hook_vs_gloo("float"),
    "optimizer": lambda: optimizer_vs_single("none"),
    "optimizer_passes": lambda: optimizer_vs_single("passes"),
    "optimizer_no_sync": lambda: optimizer_vs_single("no_sync"),
    "unused": unused_parameter,
    "dtypes": dtypes,
    "server_optimizer": server_optimizer,
    "optimizer_state": optimizer_state,
    "killed": killed,
    "gil": gil_released,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    SCENARIOS[sys.argv[1]]()
