"""The peer of bench/elastic_bench.py: what torch users do today. The CNN of
examples/torch_cnn.py under torchrun --max_restarts=1, DDP over gloo,
DistributedSampler, SGD with momentum, gradient clipping, a checkpoint
written by rank 0 after every epoch; a restarted worker group resumes from
the last checkpoint.

    torchrun --nproc_per_node=4 --max_restarts=1 --rdzv_backend=c10d \\
        --rdzv_endpoint=127.0.0.1:PORT bench/elastic_peer.py \\
        --checkpoint=/tmp/ckpt.pt --kill_rank=2 --kill_step=350

In the first attempt (TORCHELASTIC_RESTART_COUNT 0) the worker of rank
--kill_rank SIGKILLs itself before global step --kill_step, printing
{"killed_at": wall clock}. Every worker prints at the end {rank, restart,
resumed_step, first_step_at (wall clock of its first completed step in
this attempt), kill_step_at (of step --kill_step), test_accuracy}.
"""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir, "examples"))
import torch_cnn  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--clip", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kill_rank", type=int, default=-1)
    p.add_argument("--kill_step", type=int, default=-1)
    p.add_argument("--data_dir", default=torch_cnn.DATA_DIR)
    return p.parse_args(argv)


def save(path, epoch, model, opt):
    tmp = path + ".tmp"
    torch.save({"epoch": epoch, "model": model.state_dict(),
                "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    train_set = torch_cnn.load(args.data_dir, "train")
    test_set = torch_cnn.load(args.data_dir, "t10k")
    torch.manual_seed(args.seed)
    model = torch_cnn.Net()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr,
                          momentum=args.momentum)
    start_epoch = 0
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        start_epoch = saved["epoch"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=args.batch, sampler=sampler)
    step = start_epoch * len(loader)
    marks = {"rank": rank, "restart": restart, "resumed_step": step}
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if restart == 0 and rank == args.kill_rank and \
                    step == args.kill_step:
                print(json.dumps({"killed_at": time.time()}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.clip)
            opt.step()
            step += 1
            marks.setdefault("first_step_at", time.time())
            if step == args.kill_step + 1:
                marks["kill_step_at"] = time.time()
        if rank == 0:
            save(args.checkpoint, epoch + 1, model, opt)
    marks["test_accuracy"] = round(torch_cnn.evaluate(
        model, rank, size, dist.all_reduce, test_set, torch.device("cpu")), 4)
    print(json.dumps(marks), flush=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # Every collective is done: leave without gloo's teardown, which now and
    # then hangs a worker of a restarted group at exit.
    os._exit(code)
