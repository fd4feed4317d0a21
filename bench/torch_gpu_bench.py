"""Step time of a ResNet-style CNN (26 layers, synthetic 32x32 images) on one
GPU with torch DDP over NCCL and with gradsync over its NCCL backend
(gradient_device=cuda), in the same run, each configuration a torchrun job
of world size 1 (one GPU admits one NCCL rank):

  local      the model alone: forward, backward, SGD step (no communication)
  ddp        DistributedDataParallel over torch's NCCL process group
  hook       DDP with gradsync's comm hook (gradsync's NCCL backend)
  optimizer  gradsync.torch.DistributedOptimizer (gradsync's NCCL backend)

    python3 bench/torch_gpu_bench.py [--reps=2] [--steps=60] [--batch=128]
    python3 -m torch.distributed.run --nproc_per_node=1 bench/torch_gpu_bench.py \
        --worker --config=hook --profile        # one configuration, profiled

Each step is timed on the host from its start to torch.cuda.synchronize()
after the optimizer step; the figure is the median over the steps and the
repetitions (configurations interleaved). `backward_ms` is the host's time
from the step's start until backward() returns (forward and backward
queued, and whatever the gradient hand-over waits for). `comm_ms` is the time of the
implementation's own all-reduce of the model's gradient bytes in 25 MB
tensors with nothing else running (torch.distributed.all_reduce for ddp,
gradsync's allreduce for hook and optimizer); `exposed` is
(step - local step) / comm_ms: 0 when communication hides completely behind
backward, 1 when none of it does (above 1: costs beyond the all-reduce).
Prints a table and one JSON line per configuration; needs torch with CUDA
and libgradsync.so built with --config=cuda (GRADSYNC_LIBRARY)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
CONFIGS = ["local", "ddp", "hook", "optimizer"]
BUCKET_BYTES = 25 << 20


def resnet(blocks=(3, 3, 3, 3), widths=(64, 128, 256, 512), classes=10):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.skip = nn.Sequential()
            if stride != 1 or cin != cout:
                self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b1(self.c1(x)).relu()
            return (self.b2(self.c2(y)) + self.skip(x)).relu()

    layers = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()]
    cin = widths[0]
    for i, (n, w) in enumerate(zip(blocks, widths)):
        for j in range(n):
            layers.append(Block(cin, w, 2 if (j == 0 and i > 0) else 1))
            cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def chunks_of(torch, total_elems, device):
    per = BUCKET_BYTES // 4
    sizes = [per] * (total_elems // per) + ([total_elems % per] if total_elems % per else [])
    return [torch.zeros(n, device=device) for n in sizes]


def worker(args):
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    model = resnet().to(device)
    params = sum(p.numel() for p in model.parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    comm_time = None
    if args.config in ("hook", "optimizer"):
        import gradsync
        import gradsync.torch as gst
        gradsync.init(gradient_device="cuda", backend="nccl")
    if args.config == "ddp" or args.config == "hook":
        dist.init_process_group("nccl")
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        if args.config == "hook":
            net.register_comm_hook(gst.HookState(), gst.allreduce_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    elif args.config == "optimizer":
        net = model
        opt = gst.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    else:
        net, opt = model, sgd
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, backward = [], []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss_fn(net(x), y).backward()
        returned = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
            backward.append(returned - start)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                opt.zero_grad(set_to_none=False)
                loss_fn(net(x), y).backward()
                opt.step()
                torch.cuda.synchronize()
        for key in ("self_cpu_time_total", "self_cuda_time_total"):
            print(prof.key_averages().table(sort_by=key, row_limit=18), flush=True)
    if args.config != "local":
        tensors = chunks_of(torch, params, device)
        if args.config == "ddp":
            reduce = lambda t: dist.all_reduce(t)
        else:
            reduce = lambda t: gst.allreduce(t)
        for _ in range(3):
            for t in tensors:
                reduce(t)
        torch.cuda.synchronize()
        samples = []
        for _ in range(20):
            start = time.perf_counter()
            for t in tensors:
                reduce(t)
            torch.cuda.synchronize()
            samples.append(time.perf_counter() - start)
        comm_time = statistics.median(samples)
    print("RESULT " + json.dumps({"config": args.config, "step_s": times,
                                  "backward_s": backward, "params": params,
                                  "comm_s": comm_time, "gpu": torch.cuda.get_device_name(0)}),
          flush=True)
    if args.config in ("hook", "optimizer"):
        gradsync.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_config(args, config, port):
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
            "--master_port=%d" % port, os.path.abspath(__file__), "--worker",
            "--config=" + config, "--steps=%d" % args.steps, "--warmup=%d" % args.warmup,
            "--batch=%d" % args.batch]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="4")
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=600)
    out = done.stdout.decode("utf-8", "replace")
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit("%s failed (exit %d):\n%s" % (config, done.returncode, out[-4000:]))
    return json.loads(lines[-1][len("RESULT "):])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", choices=CONFIGS)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--profile", action="store_true",
                   help="with --worker: also print torch.profiler tables of 10 steps")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    configs = args.configs.split(",")
    results = {c: {"step_s": [], "backward_s": [], "comm_s": []} for c in configs}
    port = 29500 + os.getpid() % 1000
    for rep in range(args.reps):
        for c in configs:
            r = run_config(args, c, port)
            port += 2
            results[c]["step_s"] += r["step_s"]
            results[c]["backward_s"] += r["backward_s"]
            if r["comm_s"] is not None:
                results[c]["comm_s"].append(r["comm_s"])
            results[c]["params"] = r["params"]
            results[c]["gpu"] = r["gpu"]
    step = {c: statistics.median(results[c]["step_s"]) * 1e3 for c in configs}
    print("%-10s %10s %10s %12s %10s %9s" % ("config", "step_ms", "vs_ddp", "backward_ms",
                                            "comm_ms", "exposed"))
    for c in configs:
        comm = statistics.median(results[c]["comm_s"]) * 1e3 if results[c]["comm_s"] else None
        back = statistics.median(results[c]["backward_s"]) * 1e3
        vs = step[c] / step["ddp"] if "ddp" in step else None
        exposed = (step[c] - step["local"]) / comm if comm and "local" in step else None
        print("%-10s %10.3f %10s %12.3f %10s %9s" % (
            c, step[c], "%.3f" % vs if vs else "-", back, "%.3f" % comm if comm else "-",
            "%.2f" % exposed if exposed is not None else "-"))
        print(json.dumps({"impl": c, "step_ms": step[c], "vs_ddp": vs, "backward_ms": back,
                          "comm_ms": comm,
                          "exposed": exposed, "params": results[c]["params"],
                          "steps": len(results[c]["step_s"]), "gpu": results[c]["gpu"]}))


if __name__ == "__main__":
    main()
