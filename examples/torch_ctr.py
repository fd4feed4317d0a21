#!/usr/bin/env python3
"""Click-through-rate training with large sparse embedding tables, the
tables on gradsync's parameter servers and the dense part under DDP.

    gradsync_launch --workers=4 --servers=2 -- .venv/bin/python examples/torch_ctr.py
    gradsync_launch --workers=4 -- .venv/bin/python examples/torch_ctr.py --comm=ddp-gloo

--comm chooses where the tables live:
  gradsync   gradsync.torch.ShardedEmbeddingBag per table on the shards
             (row-wise Adagrad there: set GRADSYNC_EMBEDDING_OPTIMIZER and
             GRADSYNC_EMBEDDING_LR to match --emb_lr), the dense MLP in
             DistributedDataParallel over the "gradsync" backend
  ddp-gloo   every worker holds every table as nn.EmbeddingBag(sparse=True)
             inside DistributedDataParallel over gloo (its sparse gradients
             all-gathered), torch.optim.Adagrad on them: the anchor

The data is synthetic, drawn from a hidden model whose best AUC is known:
--tables categorical features, each an id drawn Zipf(--zipf) over --vocab
ids (then scattered over the id space); every id has a hidden effect
(a pure function of table and id), and a sample is clicked with
probability sigmoid(bias + sum of its ids' effects). The best reachable
AUC is that of the hidden probability itself on the evaluation set.

The model: one embedding bag of width --dim per table (one id per bag,
mode sum), concatenated, then a 2-layer MLP to one logit; BCE loss, SGD on
the MLP. Each worker trains --steps steps of --batch samples of its own
stream. Rank 0 evaluates --eval_samples held-out samples and prints one
JSON line: comm, auc, best_auc, log_loss, best_log_loss, samples_per_s (all
workers, steps after the first --warmup), step_p50_ms, workers, steps,
batch, tables, vocab, dim, prefetch, peak_rss_mb (rank 0). With --prefetch
(gradsync) each step's rows are pulled during the optimizer step of the
step before (ShardedEmbeddingBag.prefetch).
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def uniform(bits):
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


class HiddenModel:
    """Ids and labels from the hidden model (see the module doc)."""

    def __init__(self, tables, vocab, zipf, seed=1):
        self.tables, self.vocab, self.zipf, self.seed = tables, vocab, zipf, seed
        self.bias = -1.2
        # An odd multiplier scatters Zipf ranks over [0, vocab).
        self.spread = 2654435761 % vocab or 1
        while np.gcd(self.spread, vocab) != 1:
            self.spread += 1

    def effects(self, table, ids):
        """Each id's hidden effect, normal with sd 0.8 (Box-Muller)."""
        key = splitmix64(np.uint64(self.seed * 1000 + table) ^ ids.astype(np.uint64))
        u1 = np.maximum(uniform(key), 1e-300)
        u2 = uniform(splitmix64(key))
        return 0.8 * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def batch(self, rng, n):
        """(ids: n x tables int64, clicked: n float32, probability: n)."""
        ranks = rng.zipf(self.zipf, size=(n, self.tables)) - 1
        ranks = np.where(ranks < self.vocab, ranks, rng.integers(0, self.vocab, ranks.shape))
        ids = (ranks.astype(np.int64) * self.spread) % self.vocab
        logit = self.bias + sum(self.effects(t, ids[:, t]) for t in range(self.tables))
        p = 1.0 / (1.0 + np.exp(-logit))
        clicked = (rng.random(n) < p).astype(np.float32)
        return ids, clicked, p


def auc(scores, labels):
    """Area under the ROC curve (Mann-Whitney, ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(p, labels):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


class Dense(torch.nn.Module):
    def __init__(self, tables, dim, hidden=64):
        super().__init__()
        torch.manual_seed(5)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(tables * dim, hidden),
                                       torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def forward(self, x):
        return self.mlp(x).squeeze(1)


class Local(torch.nn.Module):
    """The anchor's model: every table in this process."""

    def __init__(self, tables, vocab, dim):
        super().__init__()
        torch.manual_seed(6)
        self.bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True) for _ in range(tables))
        for b in self.bags:
            torch.nn.init.uniform_(b.weight, -dim ** -0.5, dim ** -0.5)
        self.dense = Dense(tables, dim)

    def forward(self, ids):
        return self.dense(torch.cat([b(ids[:, t:t + 1]) for t, b in enumerate(self.bags)], 1))


class Sharded(torch.nn.Module):
    """gradsync's: the tables on the shards, the MLP under DDP."""

    def __init__(self, tables, vocab, dim):
        super().__init__()
        import gradsync.torch as gst
        self.bags = torch.nn.ModuleList(
            gst.ShardedEmbeddingBag(None, dim, mode="sum", table=t) for t in range(tables))
        self.dense = DistributedDataParallel(Dense(tables, dim))

    def forward(self, ids):
        return self.dense(torch.cat([b(ids[:, t:t + 1]) for t, b in enumerate(self.bags)], 1))

    def prefetch(self, ids):
        """Starts the pulls of the next batch's rows (after the backward pass)."""
        for t, b in enumerate(self.bags):
            b.prefetch(ids[:, t:t + 1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--comm", choices=["gradsync", "ddp-gloo"], default="gradsync")
    ap.add_argument("--tables", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1000000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--emb_lr", type=float, default=0.05)
    ap.add_argument("--dense_lr", type=float, default=0.05)
    ap.add_argument("--eval_samples", type=int, default=50000)
    ap.add_argument("--prefetch", action="store_true",
                    help="gradsync: pull the next batch's rows during the optimizer step")
    args = ap.parse_args()
    if args.prefetch and args.comm != "gradsync":
        sys.exit("torch_ctr.py: --prefetch is for --comm=gradsync")

    if args.comm == "gradsync":
        import gradsync  # registers the backend
        optimizer = os.environ.get("GRADSYNC_EMBEDDING_OPTIMIZER", "adagrad")
        lr = float(os.environ.get("GRADSYNC_EMBEDDING_LR", "0.01"))
        if optimizer != "adagrad" or abs(lr - args.emb_lr) > 1e-12:
            sys.exit("torch_ctr.py: --comm=gradsync needs GRADSYNC_EMBEDDING_OPTIMIZER=adagrad "
                     "and GRADSYNC_EMBEDDING_LR=%g (the shards' optimizer), got %s and %g"
                     % (args.emb_lr, optimizer, lr))
        dist.init_process_group("gradsync")
        model = Sharded(args.tables, args.vocab, args.dim)
        dense_params = model.dense.parameters()
        opts = [torch.optim.SGD(dense_params, lr=args.dense_lr)]
    else:
        dist.init_process_group("gloo")
        local = Local(args.tables, args.vocab, args.dim)
        model = DistributedDataParallel(local)
        opts = [torch.optim.Adagrad(local.bags.parameters(), lr=args.emb_lr, eps=1e-10),
                torch.optim.SGD(local.dense.parameters(), lr=args.dense_lr)]
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden = HiddenModel(args.tables, args.vocab, args.zipf)
    rng = np.random.default_rng(100 + rank)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    step_s = []
    dist.barrier()
    start = None
    batch = hidden.batch(rng, args.batch)
    for step in range(args.steps):
        if step == args.warmup:
            dist.barrier()
            start = time.monotonic()
        ids, clicked, _ = batch
        t0 = time.monotonic()
        for o in opts:
            o.zero_grad()
        loss = loss_fn(model(torch.from_numpy(ids)), torch.from_numpy(clicked))
        loss.backward()
        # The next batch, made here so that its rows can be prefetched
        # during the optimizer step (its making is not in the step's time).
        t1 = time.monotonic()
        batch = hidden.batch(rng, args.batch)
        made_s = time.monotonic() - t1
        if args.prefetch and step + 1 < args.steps:
            model.prefetch(torch.from_numpy(batch[0]))
        for o in opts:
            o.step()
        step_s.append(time.monotonic() - t0 - made_s)
        if rank == 0 and step % 50 == 0:
            print("step %d loss %.4f" % (step, loss.item()), file=sys.stderr, flush=True)
    dist.barrier()
    wall = time.monotonic() - start
    result = None
    if rank == 0:
        eval_ids, eval_clicked, best = hidden.batch(np.random.default_rng(7), args.eval_samples)
        model.eval()
        with torch.no_grad():
            scores = []
            for at in range(0, args.eval_samples, 4096):
                chunk = torch.from_numpy(eval_ids[at:at + 4096])
                scores.append(torch.sigmoid(model(chunk)).numpy())
        p = np.concatenate(scores)
        result = {
            "comm": args.comm, "auc": auc(p, eval_clicked), "best_auc": auc(best, eval_clicked),
            "log_loss": log_loss(p, eval_clicked), "best_log_loss": log_loss(best, eval_clicked),
            "samples_per_s": world * args.batch * (args.steps - args.warmup) / wall,
            "step_p50_ms": float(np.median(step_s[args.warmup:]) * 1000), "workers": world,
            "steps": args.steps, "batch": args.batch, "tables": args.tables,
            "vocab": args.vocab, "dim": args.dim, "prefetch": args.prefetch,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    dist.barrier()
    dist.destroy_process_group()
    if result is not None:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
