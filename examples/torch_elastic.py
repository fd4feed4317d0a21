#!/usr/bin/env python3
"""Elastic data-parallel training of examples/torch_cnn.py's CNN on
Fashion-MNIST with gradsync.torch.elastic: a lost worker costs the others
one step, not the job.

    gradsync_launch --workers=4 --min_workers=3 -- \\
        .venv/bin/python examples/torch_elastic.py --kill_rank=2 --kill_step=40

DistributedOptimizer over SGD with momentum, gradients clipped to
--clip, an ElasticSampler over the training set (re-dealt among the workers
after a change), the test set evaluated at the end. --kill_rank R
--kill_step S: the worker started as rank R SIGKILLs itself before step S (to
watch the job go on). --checkpoint_every N --checkpoint_dir D: after every
N-th step rank 0 saves the model and optimizer to D/checkpoint.pt and all
workers meet in a barrier (the others wait until it is written).
--hold_step S --hold_workers N: before step S the workers wait (in
barriers, up to --hold_timeout_s) until the job has N workers again, as a
job that wants a replacement in before it goes on. Each worker prints JSON
lines: the one that kills
itself {"killed_at": wall clock} (--depart_rank / --depart_step: that
worker leaves the job on purpose, gradsync.depart, and prints
{"departed_at"}), and at the end every other one {rank,
workers, membership_epoch, steps, test_accuracy, first_loss, last_loss,
joined (a worker that joined the running job), started_at, recoveries,
reset_at / recovered_at (wall clock of each recovery and of the next
completed step), checkpoints (the checkpoint barriers it passed),
state_sha256 (parameters, buffers and optimizer state)}.
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cnn  # noqa: E402  (also puts python/ on sys.path)
import gradsync  # noqa: E402
import gradsync.torch as gst  # noqa: E402
from gradsync.torch import elastic  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--clip", type=float, default=5.0,
                   help="gradient norm clipped to this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=0,
                   help="> 0: stop after that many steps")
    p.add_argument("--kill_rank", type=int, default=-1)
    p.add_argument("--kill_step", type=int, default=-1)
    p.add_argument("--depart_rank", type=int, default=-1,
                   help="this rank leaves the job on purpose (gradsync.depart)")
    p.add_argument("--depart_step", type=int, default=-1)
    p.add_argument("--hold_step", type=int, default=-1,
                   help="before this step, wait until --hold_workers are in")
    p.add_argument("--hold_workers", type=int, default=0)
    p.add_argument("--hold_timeout_s", type=float, default=120.0)
    p.add_argument("--checkpoint_every", type=int, default=0,
                   help="> 0: rank 0 saves a checkpoint every N steps")
    p.add_argument("--checkpoint_dir", default=".")
    p.add_argument("--data_dir", default=torch_cnn.DATA_DIR)
    return p.parse_args(argv)


def state_digest(state):
    """sha256 of the model's parameters and buffers and the optimizer's
    state tensors, in a fixed order."""
    h = hashlib.sha256()
    tensors = list(state.model.state_dict().values())
    for per_param in state.optimizer.state_dict()["state"].values():
        tensors += [v for _, v in sorted(per_param.items()) if torch.is_tensor(v)]
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def evaluate(model, data):
    """Accuracy on `data`, each worker counting its share."""
    comm = gradsync.communicator()
    return torch_cnn.evaluate(model, comm.rank, comm.size,
                              lambda t: gst.allreduce(t, average=False), data,
                              torch.device("cpu"))


class Trainer:
    def __init__(self, args):
        self.args = args
        comm = gradsync.communicator()
        # A worker that joined a running job (a restarted one) kills nothing.
        self.joined = comm.epoch > 0
        self.first_rank = -1 if self.joined else comm.rank
        self.train_set = torch_cnn.load(args.data_dir, "train")
        self.test_set = torch_cnn.load(args.data_dir, "t10k")
        torch.manual_seed(args.seed)
        model = torch_cnn.Net()
        self.opt = gst.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr,
                            momentum=args.momentum),
            named_parameters=model.named_parameters())
        sampler = elastic.ElasticSampler(self.train_set, args.batch,
                                         seed=args.seed)
        self.loader = DataLoader(self.train_set, batch_size=args.batch,
                                 sampler=sampler)
        self.state = elastic.State(model, self.opt, sampler=sampler)
        self.state.on_reset(self.reset)
        self.losses = []
        self.marks = {"recoveries": 0, "joined": self.joined, "reset_at": [],
                      "recovered_at": [], "checkpoints": 0}

    def reset(self, state):
        self.marks["recoveries"] += 1
        self.marks["reset_at"].append(time.time())

    def step(self, x, y):
        args, state = self.args, self.state
        if self.first_rank == args.kill_rank and state.step == args.kill_step:
            print(json.dumps({"killed_at": time.time()}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.first_rank == args.depart_rank and \
                state.step == args.depart_step:
            # As on a preemption notice: the others go on at once.
            print(json.dumps({"departed_at": time.time()}), flush=True)
            gradsync.depart("preempted")
            sys.exit(0)
        if state.step == args.hold_step:
            self.hold()
        loss = F.cross_entropy(state.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.synchronize()
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), args.clip)
        with self.opt.skip_synchronize():
            self.opt.step()
        state.commit()
        marks = self.marks
        if len(marks["recovered_at"]) < len(marks["reset_at"]):
            marks["recovered_at"].append(time.time())
        self.losses.append(loss.item())
        if args.checkpoint_every > 0 and state.step % args.checkpoint_every == 0:
            self.checkpoint()

    def hold(self):
        """Barriers until --hold_workers are in: the barrier of the job that
        admits a joiner raises MembershipChanged, and run() comes back here
        with the new size."""
        comm = gradsync.communicator()
        deadline = time.monotonic() + self.args.hold_timeout_s
        while comm.size < self.args.hold_workers:
            if time.monotonic() > deadline:
                print("hold: %d of %d workers after %.0f s; going on" %
                      (comm.size, self.args.hold_workers,
                       self.args.hold_timeout_s), file=sys.stderr, flush=True)
                return
            comm.barrier()
            time.sleep(0.05)

    def checkpoint(self):
        """Rank 0 writes the state; every worker waits for it in a barrier
        (a change of workers meanwhile raises MembershipChanged, and run()
        goes on from the agreed step)."""
        comm = gradsync.communicator()
        if comm.rank == 0:
            path = os.path.join(self.args.checkpoint_dir, "checkpoint.pt")
            torch.save({"step": self.state.step,
                        "model": self.state.model.state_dict(),
                        "optimizer": self.opt.state_dict()}, path + ".tmp")
            os.replace(path + ".tmp", path)
        comm.barrier()
        self.marks["checkpoints"] += 1

    def train(self, state):
        while state.epoch < self.args.epochs:
            for x, y in self.loader:
                if state.step == self.args.max_steps > 0:
                    return evaluate(state.model, self.test_set)
                self.step(x, y)
            state.next_epoch()
        return evaluate(state.model, self.test_set)


def process_started_at():
    """Wall clock of this process's start (Linux /proc, to 10 ms)."""
    now = time.time()
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return now - uptime + ticks / os.sysconf("SC_CLK_TCK")


def main(argv):
    started = process_started_at()
    args = parse_args(argv)
    torch.set_num_threads(1)
    gradsync.init()
    trainer = Trainer(args)
    accuracy = elastic.run(trainer.train)(trainer.state)
    state, window = trainer.state, torch_cnn.LOSS_WINDOW
    losses = trainer.losses
    print(json.dumps(dict(
        rank=gradsync.rank(), workers=gradsync.size(),
        membership_epoch=gradsync.communicator().epoch, steps=state.step,
        test_accuracy=round(accuracy, 4),
        first_loss=round(sum(losses[:window]) / max(1, len(losses[:window])), 4),
        last_loss=round(sum(losses[-window:]) / max(1, len(losses[-window:])), 4),
        state_sha256=state_digest(state), started_at=started,
        **trainer.marks)), flush=True)
    gradsync.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
