"""One worker of a tests/torch embedding job (embedding_test.py): a hybrid
model, a ShardedEmbeddingBag on the parameter servers and a dense head
under DDP over the "gradsync" backend, trained on this rank's share of
each step's batch. Rank 0 also trains the one-process reference on the
whole batch: nn.EmbeddingBag(sparse=True) started from the shards'
initializer (computed here from its formula, ps/embedding_table.h) with
the same row-wise optimizer. Prints "RESULT <json>"."""
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gradsync
import gradsync.torch as gst

VOCAB, DIM, BAGS, BAG_LEN = 4000, 16, 8, 5
DENSE_LR = 0.1
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def splitmix64(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def init_rows(seed, table, ids, scale, dim):
    """The shards' initializer, rows of `ids` (ps/embedding_table.h)."""
    salt = np.uint64(0x656D62496E697421)
    key = splitmix64(splitmix64(splitmix64(np.uint64(seed) ^ salt) ^
                                np.uint64(table)) ^ ids.astype(np.uint64))
    with np.errstate(over="ignore"):
        bits = splitmix64(key[:, None] + np.arange(dim, dtype=np.uint64)[None, :])
    u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    return np.float32(scale) * (np.float32(2.0) * u - np.float32(1.0))


def global_batch(step, world):
    """Step `step`'s whole batch: BAGS bags of BAG_LEN ids per rank, ids
    skewed towards small ones (with repeats inside a batch), and labels."""
    g = torch.Generator().manual_seed(7000 + step)
    ids = (torch.rand(world * BAGS, BAG_LEN, generator=g) ** 3 * VOCAB).long()
    labels = (torch.rand(world * BAGS, 1, generator=g) < 0.3).float()
    return ids, labels


def head():
    torch.manual_seed(3)
    return torch.nn.Linear(DIM, 1)


def row_optimizer(name, params):
    lr = float(os.environ["GRADSYNC_EMBEDDING_LR"])
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=1e-10)
    if name == "adam":
        return torch.optim.SparseAdam(params, lr=lr, eps=1e-8)
    return torch.optim.SGD(params, lr=lr)


def reference(steps, world, optimizer):
    """The one-process model on the whole batch: (rows, head weight)."""
    scale = float(os.environ["GRADSYNC_EMBEDDING_INIT_SCALE"])
    bag = torch.nn.EmbeddingBag(VOCAB, DIM, mode="mean", sparse=True)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(
            init_rows(0, 0, np.arange(VOCAB), scale, DIM)))
    dense = head()
    rows_opt = row_optimizer(optimizer, bag.parameters())
    dense_opt = torch.optim.SGD(dense.parameters(), lr=DENSE_LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(steps):
        ids, labels = global_batch(step, world)
        rows_opt.zero_grad()
        dense_opt.zero_grad()
        loss_fn(dense(bag(ids)), labels).backward()
        rows_opt.step()
        dense_opt.step()
    return bag.weight.detach(), dense.weight.detach()


def train(steps, optimizer):
    dist.init_process_group("gradsync")
    rank, world = dist.get_rank(), dist.get_world_size()
    bag = gst.ShardedEmbeddingBag(None, DIM, mode="mean")
    dense = DistributedDataParallel(head())
    dense_opt = torch.optim.SGD(dense.parameters(), lr=DENSE_LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    prefetch = os.environ.get("PREFETCH") == "1"
    mine = slice(rank * BAGS, (rank + 1) * BAGS)
    for step in range(steps):
        ids, labels = global_batch(step, world)
        dense_opt.zero_grad()
        loss_fn(dense(bag(ids[mine])), labels[mine]).backward()
        if prefetch and step + 1 < steps:
            bag.prefetch(global_batch(step + 1, world)[0][mine])
        dense_opt.step()
    bag.eval()
    with torch.no_grad():
        rows = bag.pull(torch.arange(VOCAB))
    fields = {"steps": bag.step, "prefetch_hits": bag.prefetch_hits}
    if rank == 0:
        want_rows, want_head = reference(steps, world, optimizer)
        scale = float(os.environ["GRADSYNC_EMBEDDING_INIT_SCALE"])
        start = torch.from_numpy(init_rows(0, 0, np.arange(VOCAB), scale, DIM))
        fields.update(
            rows_difference=(rows - want_rows).abs().max().item(),
            head_difference=(dense.module.weight.detach() -
                             want_head).abs().max().item(),
            rows_moved=(want_rows - start).abs().max().item(),
            rows_changed=int(((want_rows - start).abs().sum(1) > 0).sum()))
    dist.barrier()
    dist.destroy_process_group()
    return fields


def wrong_width():
    """A table used at another width: the shards refuse it, naming both."""
    dist.init_process_group("gradsync")
    wide = gst.ShardedEmbeddingBag(None, 8, table=5)
    wide.pull(torch.arange(10))
    narrow = gst.ShardedEmbeddingBag(None, 4, table=5)
    try:
        narrow.pull(torch.arange(10))
        error = None
    except gradsync.GradsyncError as e:
        error = str(e)
    out_of_range = None
    try:
        gst.ShardedEmbeddingBag(100, 4, table=6)(torch.tensor([[3, 100]]))
    except ValueError as e:
        out_of_range = str(e)
    return {"error": error, "out_of_range": out_of_range}


def flood(steps, flood_ids):
    """Table 0 trains on 500 ids from both ranks; on table 1, rank 1 pushes
    `flood_ids` ids never seen before every step (rank 0 pushes nothing
    there). Returns table 0's rows (their sum, and a digest of their bits)."""
    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    hot = gst.ShardedEmbeddingBag(None, DIM, mode="sum", table=0)
    cold = gst.ShardedEmbeddingBag(None, DIM, mode="sum", table=1)
    weights = torch.linspace(-1.0, 1.0, DIM)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        ids = torch.randint(0, 500, (BAGS, BAG_LEN), generator=g)
        (hot(ids) * weights).sum().backward()
        if rank == 1 and flood_ids:
            fresh = torch.arange(flood_ids) + (1 << 40) + step * flood_ids
            (cold(fresh.reshape(-1, 1)) * weights).sum().backward()
        else:  # an empty bag pushes its (empty) step at once
            cold(torch.zeros(0, 1, dtype=torch.int64))
    hot.eval()
    cold.wait()
    with torch.no_grad():
        rows = hot.pull(torch.arange(500))
    hold = os.environ.get("HOLD_FILE")  # the test reads the shards' metrics meanwhile
    deadline = time.monotonic() + 120
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()
    return {"rows_sum": rows.double().sum().item(),
            "rows_digest": hashlib.sha256(rows.numpy().tobytes()).hexdigest()}


def behind(steps, marks):
    """Rank 0's bags are empty (its pushes of the table are empty); rank 1
    holds its first push back until rank 0 marks step 3 (a file in `marks`)
    or 3 s pass. Rank 0 waits for each round before it at every shard, so
    it is never a round too far ahead. Returns the steps made."""
    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    table = gst.ShardedEmbeddingBag(None, DIM, mode="sum", table=7)
    weights = torch.linspace(-1.0, 1.0, DIM)
    for step in range(steps):
        if rank == 0:
            open(os.path.join(marks, "step%d" % step), "w").close()
            table(torch.zeros(0, 1, dtype=torch.int64))
            continue
        out = (table(torch.arange(40).reshape(-1, 2) + 40 * step) * weights).sum()
        deadline = time.monotonic() + 3
        while step == 0 and not os.path.exists(os.path.join(marks, "step3")) and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        out.backward()
    table.wait()
    dist.barrier()
    dist.destroy_process_group()
    return {"steps": table.step}


def replicas(steps, mark_at):
    """Table 0 trains on 500 ids for `steps` steps, a little apart; rank 0
    prints "MARK" after step `mark_at` (a test kills a shard then). Returns
    the rows' digest, and the longest step after the mark."""
    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    hot = gst.ShardedEmbeddingBag(None, DIM, mode="sum", table=0)
    weights = torch.linspace(-1.0, 1.0, DIM)
    longest = 0.0
    for step in range(steps):
        started = time.monotonic()
        g = torch.Generator().manual_seed(100 * step + rank)
        ids = torch.randint(0, 500, (BAGS, BAG_LEN), generator=g)
        (hot(ids) * weights).sum().backward()
        hot.wait()
        if step > mark_at:
            longest = max(longest, time.monotonic() - started)
        if rank == 0 and step == mark_at:
            print("MARK", flush=True)
        time.sleep(0.03)
    hot.eval()
    with torch.no_grad():
        rows = hot.pull(torch.arange(500))
    lag = own_metric("gradsync_client_embedding_replication_lag_seconds_count")
    dist.barrier()
    dist.destroy_process_group()
    return {"rows_digest": hashlib.sha256(rows.numpy().tobytes()).hexdigest(),
            "longest_step_s": longest, "steps": hot.step, "replication_lags": lag}


def own_metric(name):
    """The value of sample `name` on this worker's /metrics (None when the
    job serves none: GRADSYNC_METRICS_BASE_PORT 0)."""
    import urllib.request
    base = int(os.environ.get("GRADSYNC_METRICS_BASE_PORT", "0"))
    if base == 0:
        return None
    port = base + int(os.environ.get("LOCAL_RANK", "0"))
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


class SlowPush:
    """A communicator whose push of table rows for step `step` waits
    `delay_s` first (a worker held up: its push of the step the others
    completed arrives after a membership change)."""

    def __init__(self, comm, step, delay_s):
        self._comm, self._step, self._delay_s = comm, step, delay_s

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def push_rows(self, table, dim, ids, n, grads, step):
        if step == self._step:
            time.sleep(self._delay_s)
        return self._comm.push_rows(table, dim, ids, n, grads, step)


def elastic_job(steps, kill_rank, kill_step, kill_at, slow_rank):
    """An elastic job (gradsync_launch --min_workers): the table beside a
    dense head under DistributedOptimizer, in elastic.run. The worker
    started as `kill_rank` SIGKILLs itself in step `kill_step`: with
    kill_at "push", right after its backward pass handed the step's push
    to its thread; with "start", before the step, once its push of the
    step before was taken. The worker started as `slow_rank` (-1: none)
    sends its push of step kill_step - 1 two seconds late. Prints the
    result as JSON (the launcher prefixes it with the worker)."""
    from gradsync.torch import elastic
    gradsync.init()
    comm = gradsync.communicator()
    first_rank, joined = comm.rank, comm.epoch > 0
    tables_comm = SlowPush(comm, kill_step - 1, 2.0) if first_rank == slow_rank else None
    table = gst.ShardedEmbeddingBag(None, DIM, mode="sum", table=0, comm=tables_comm)
    dense = head()
    model = torch.nn.ModuleDict({"table": table, "head": dense})
    opt = gst.DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=DENSE_LR),
                                   named_parameters=dense.named_parameters())
    state = elastic.State(model, opt)
    recovered_at = []
    losses = []
    state.on_reset(lambda s: recovered_at.append(s.step))
    loss_fn = torch.nn.BCEWithLogitsLoss()

    @elastic.run
    def loop(state):
        while state.step < steps:
            dies = first_rank == kill_rank and not joined and state.step == kill_step
            if dies and kill_at == "start":
                table.wait()
                os.kill(os.getpid(), signal.SIGKILL)
            # This rank's bags of the step, whatever the job's size now.
            g = torch.Generator().manual_seed(1000 * state.step + comm.rank)
            ids = (torch.rand(BAGS, BAG_LEN, generator=g) ** 3 * VOCAB).long()
            labels = (ids[:, :1] % 3 == 0).float()
            opt.zero_grad()
            loss = loss_fn(dense(table(ids)), labels)
            loss.backward()
            if dies and kill_at == "push":
                os.kill(os.getpid(), signal.SIGKILL)
            opt.step()
            state.commit()
            losses.append(loss.item())
    loop(state)
    table.eval()
    with torch.no_grad():
        rows = table.pull(torch.arange(VOCAB))
    digest = hashlib.sha256(rows.numpy().tobytes())
    digest.update(dense.weight.detach().numpy().tobytes())
    print(json.dumps({
        "rank": comm.rank, "steps": state.step, "table_step": table.step,
        "workers": comm.size, "membership_epoch": comm.epoch,
        "recovered_at": recovered_at, "state_sha256": digest.hexdigest(),
        "first_loss": sum(losses[:10]) / 10, "last_loss": sum(losses[-10:]) / 10}),
        flush=True)


def main():
    scenario = sys.argv[1]
    if scenario == "elastic":
        elastic_job(int(os.environ.get("STEPS", "60")), 2, 20, os.environ["KILL_AT"],
                    int(os.environ.get("SLOW_RANK", "-1")))
        gradsync.shutdown()
        return
    if scenario == "train":
        fields = train(int(os.environ.get("STEPS", "200")),
                       os.environ["GRADSYNC_EMBEDDING_OPTIMIZER"])
    elif scenario == "replicas":
        fields = replicas(int(os.environ.get("STEPS", "60")), 20)
    elif scenario == "behind":
        fields = behind(6, os.environ["MARKS"])
    elif scenario == "flood":
        fields = flood(int(os.environ.get("STEPS", "30")), int(os.environ["FLOOD_IDS"]))
    else:
        fields = wrong_width()
    report(**fields)
    gradsync.shutdown()


if __name__ == "__main__":
    main()
