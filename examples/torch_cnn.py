#!/usr/bin/env python3
"""Data-parallel training of a small CNN on Fashion-MNIST with PyTorch, its
gradients synchronised by torch DDP (gloo) or by gradsync.

    gradsync_launch --workers=4 -- .venv/bin/python examples/torch_cnn.py --comm=hook
    torchrun --nproc_per_node=4 examples/torch_cnn.py --comm=optimizer

--comm chooses the communication:
  ddp-gloo   DistributedDataParallel over torch's gloo process group
  hook       DistributedDataParallel with gradsync's comm hook (gloo group)
  ddp-gradsync       DistributedDataParallel over the "gradsync" backend
  ddp-gradsync-hook  the same with gradsync's comm hook on that group
  optimizer  gradsync.torch.DistributedOptimizer, no torch.distributed
  fsdp-gloo      FSDP2 (fully_shard on each layer and the model) over gloo
  fsdp-gradsync  FSDP2 over the "gradsync" backend
gradsync settings come from the GRADSYNC_* environment and from repeated
--setting=name=value (path=ps, compression=fp16, ...).

The model is the CNN of the DDP tutorials adapted to 1x28x28 images: two 3x3
convolutions with 2x2 max-pooling, then two linear layers. Every rank reads
the IDX files of Debian's dataset-fashion-mnist, trains on its
DistributedSampler shard (set_epoch each epoch) with SGD and momentum from
rank 0's initial parameters, evaluates its shard of the 10k test images,
and the counts are summed over the ranks. Rank 0 logs progress on stderr and
prints one JSON line on stdout: comm, test_accuracy, wall_s (training, first
step to last), epoch_s, cpu_epoch_s (CPU time of rank 0's process, all its
threads, per epoch), samples_per_s (all workers), step_p50_ms,
step_p99_ms, first_loss / last_loss (rank 0's mean over the first and last
20 steps), workers, epochs, steps (per worker), settings.
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir, "python"))
import gradsync  # noqa: E402
import gradsync.torch as gst  # noqa: E402

DATA_DIR = os.environ.get("GRADSYNC_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
LOSS_WINDOW = 20
MEAN, STD = 0.2860, 0.3530  # of the Fashion-MNIST training images


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3)
        self.conv2 = torch.nn.Conv2d(16, 32, 3)
        self.fc1 = torch.nn.Linear(32 * 5 * 5, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def read_idx(path):
    """An IDX file (gzip) as a numpy array of its shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split):
    images = read_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % split))
    labels = read_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % split))
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    return TensorDataset(x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--comm", choices=["ddp-gloo", "hook", "optimizer",
                                      "ddp-gradsync", "ddp-gradsync-hook",
                                      "fsdp-gloo", "fsdp-gradsync"],
                   default="hook")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=0,
                   help="> 0: stop after that many steps per worker")
    p.add_argument("--data_dir", default=DATA_DIR)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: model and gradients on the GPU of the local "
                        "rank (gradsync then takes CUDA gradients)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker")
    p.add_argument("--setting", action="append", default=[],
                   metavar="NAME=VALUE", help="a gradsync setting")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch < 1:
        p.error("--epochs and --batch must be positive")
    try:
        args.settings = dict(s.split("=", 1) for s in args.setting)
    except ValueError:
        p.error("--setting takes NAME=VALUE")
    if args.device == "cuda":
        args.settings.setdefault("gradient_device", "cuda")
    return args


def join(args):
    """Joins the job; returns (rank, size, sum_counts)."""
    if args.comm in ("ddp-gloo", "fsdp-gloo") and gradsync.torchrun_job():
        torch.distributed.init_process_group("gloo")
    elif args.comm.endswith("gradsync") or args.comm == "ddp-gradsync-hook":
        gradsync.init(**args.settings)
        torch.distributed.init_process_group("gradsync")
    else:
        gradsync.init(**args.settings)
        if args.comm != "optimizer":
            gst.init_process_group("gloo")
    if args.comm == "optimizer":
        return gradsync.rank(), gradsync.size(), \
            lambda t: gst.allreduce(t, average=False)
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), \
        torch.distributed.all_reduce


def wrap(args, model):
    """(model, optimizer) communicating as --comm says."""
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if args.comm == "optimizer":
        gst.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, gst.DistributedOptimizer(
            sgd, named_parameters=model.named_parameters())
    if args.comm.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard
        for tensor in model.state_dict().values():  # rank 0's parameters
            torch.distributed.broadcast(tensor, 0)
        for layer in model.children():
            if any(True for _ in layer.parameters()):
                fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.SGD(model.parameters(), lr=args.lr,
                                      momentum=args.momentum)
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # on model's device
    if args.comm in ("hook", "ddp-gradsync-hook"):
        ddp.register_comm_hook(gst.HookState(), gst.allreduce_hook)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=args.lr,
                                momentum=args.momentum)


def train(args, rank, size, model, opt, data, device):
    sampler = DistributedSampler(data, num_replicas=size, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    losses, step_ms, steps = [], [], 0
    start, cpu = time.perf_counter(), time.process_time()
    spent = lambda: (time.perf_counter() - start, time.process_time() - cpu)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            t0 = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step_ms.append((time.perf_counter() - t0) * 1000)
            losses.append(loss.item())
            steps += 1
            if rank == 0 and steps % 100 == 0:
                print("epoch %d step %d loss %.4f" % (epoch, steps, loss.item()),
                      file=sys.stderr, flush=True)
            if steps == args.max_steps:
                return spent(), losses, step_ms
    return spent(), losses, step_ms


def evaluate(model, rank, size, sum_counts, data, device):
    sampler = DistributedSampler(data, num_replicas=size, rank=rank, shuffle=False)
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in DataLoader(data, batch_size=500, sampler=sampler):
            x, y = x.to(device), y.to(device)
            counts[0] += (model(x).argmax(1) == y).sum().item()
            counts[1] += len(y)
    sum_counts(counts)
    return (counts[0] / counts[1]).item()


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    train_set, test_set = load(args.data_dir, "train"), load(args.data_dir, "t10k")
    device = torch.device("cpu")
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("GRADSYNC_LOCAL_RANK", 0)))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    rank, size, sum_counts = join(args)
    torch.manual_seed(args.seed + rank)  # rank 0's parameters reach all ranks
    model, opt = wrap(args, Net().to(device))
    (wall, cpu), losses, step_ms = train(args, rank, size, model, opt, train_set, device)
    accuracy = evaluate(model, rank, size, sum_counts, test_set, device)
    epochs = len(losses) * args.batch * size / len(train_set)
    if rank == 0:
        print(json.dumps({
            "comm": args.comm, "device": args.device,
            "test_accuracy": round(accuracy, 4),
            "wall_s": round(wall, 3), "epoch_s": round(wall / epochs, 3),
            "cpu_epoch_s": round(cpu / epochs, 3),
            "samples_per_s": round(len(losses) * args.batch * size / wall, 1),
            "step_p50_ms": round(float(np.percentile(step_ms, 50)), 3),
            "step_p99_ms": round(float(np.percentile(step_ms, 99)), 3),
            "first_loss": round(float(np.mean(losses[:LOSS_WINDOW])), 4),
            "last_loss": round(float(np.mean(losses[-LOSS_WINDOW:])), 4),
            "workers": size, "epochs": round(epochs, 3), "steps": len(losses),
            "settings": args.settings}), flush=True)
    if gradsync.is_initialized():
        gradsync.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
