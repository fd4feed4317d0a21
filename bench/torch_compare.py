"""PyTorch trainers side by side: examples/torch_cnn.py (same seed, same
data, 4 workers on this machine) with torch DDP over gloo and with gradsync.

    bazel run --config=opt //bench:torch_compare -- [--epochs=2] [--reps=1]

Configurations, each a gradsync_launch job (the ddp-gloo run uses gradsync
only to find its peers):
  ddp-gloo        DistributedDataParallel over gloo (the peer)
  hook-ring       DDP with gradsync's comm hook, ring all-reduce
  optimizer-ring  gradsync.torch.DistributedOptimizer, ring all-reduce
  hook-fp16       the comm hook with fp16 compression
  optimizer-ps    DistributedOptimizer on the synchronous parameter server
                  (2 shards)
  ddp-gradsync    DDP over the "gradsync" torch.distributed backend, no hook
  ddp-gradsync-fp16  DDP over that backend with the fp16 comm hook
  fsdp-gloo       FSDP2 (fully_shard) over gloo
  fsdp-gradsync   FSDP2 over the "gradsync" backend (ratios against fsdp-gloo)
The repetitions interleave the configurations. Workers run the interpreter
this script runs under (the project's venv: bench/torch_python.sh). Prints a table and one JSON
line per configuration: {"impl","comm","settings","servers","epochs",
"epoch_s","cpu_epoch_s","samples_per_s","test_accuracy","wall_ratio",
"cpu_ratio","accuracy_delta","reps"}, medians over the repetitions;
wall_ratio is epoch_s over ddp-gloo's, cpu_ratio the same for rank 0's CPU
time per epoch (less sensitive to other load on the machine than wall time),
accuracy_delta the test accuracy minus ddp-gloo's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
CONFIGS = [
    # impl, --comm, gradsync settings, servers
    ("ddp-gloo", "ddp-gloo", [], 0),
    ("hook-ring", "hook", [], 0),
    ("optimizer-ring", "optimizer", [], 0),
    ("hook-fp16", "hook", ["compression=fp16"], 0),
    ("optimizer-ps", "optimizer", ["path=ps"], 2),
    ("ddp-gradsync", "ddp-gradsync", [], 0),
    ("ddp-gradsync-fp16", "ddp-gradsync-hook", ["compression=fp16"], 0),
    ("fsdp-gloo", "fsdp-gloo", [], 0),
    ("fsdp-gradsync", "fsdp-gradsync", [], 0),
]
# The configuration a row's ratios are to (ddp-gloo where not named).
REFERENCE = {"fsdp-gradsync": "fsdp-gloo"}
WORKERS = 4


def built(path):
    """A built file: in Bazel's runfiles, else under bazel-bin/."""
    here = os.path.join(ROOT, path)
    return here if os.path.exists(here) else os.path.join(ROOT, "bazel-bin", path)


def run(comm, settings, servers, args):
    command = [built("launcher/gradsync_launch"), "--workers=%d" % WORKERS,
               "--servers=%d" % servers, "--metrics_port=0", "--",
               sys.executable, os.path.join(ROOT, "examples", "torch_cnn.py"),
               "--comm=" + comm, "--epochs=%d" % args.epochs,
               "--seed=%d" % args.seed]
    command += ["--max_steps=%d" % args.max_steps] if args.max_steps else []
    command += ["--setting=" + s for s in settings]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=args.timeout_s)
    output = done.stdout.decode("utf-8", "replace")
    results = [json.loads(line.split("] ", 1)[1]) for line in output.splitlines()
               if "] {" in line]
    if done.returncode != 0 or len(results) != 1:
        sys.exit("%s %s failed (exit %d):\n%s" % (comm, settings,
                                                 done.returncode, output[-4000:]))
    return results[0]


def summary(impl, comm, settings, servers, runs, reference):
    med = lambda key: statistics.median(r[key] for r in runs)
    row = {"impl": impl, "comm": comm, "settings": settings, "servers": servers,
           "epochs": runs[0]["epochs"], "epoch_s": round(med("epoch_s"), 3),
           "cpu_epoch_s": round(med("cpu_epoch_s"), 3),
           "samples_per_s": round(med("samples_per_s"), 1),
           "test_accuracy": round(med("test_accuracy"), 4), "reps": len(runs)}
    base = reference or row
    row["wall_ratio"] = round(row["epoch_s"] / base["epoch_s"], 3)
    row["cpu_ratio"] = round(row["cpu_epoch_s"] / base["cpu_epoch_s"], 3)
    row["accuracy_delta"] = round(row["test_accuracy"] - base["test_accuracy"], 4)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=0,
                   help="> 0: that many steps per worker (a quick look)")
    p.add_argument("--timeout_s", type=int, default=1200)
    p.add_argument("--only", default="",
                   help="comma-separated configurations (default: all)")
    args = p.parse_args()
    chosen = [c for c in CONFIGS if not args.only or c[0] in
              args.only.split(",")]
    runs = {c[0]: [] for c in chosen}
    for rep in range(args.reps):
        for impl, comm, settings, servers in chosen:
            runs[impl].append(run(comm, settings, servers, args))
            print("rep %d %-15s %s" % (rep, impl, json.dumps(runs[impl][-1])),
                  file=sys.stderr, flush=True)
    rows, by_impl = [], {}
    for impl, comm, settings, servers in chosen:
        reference = by_impl.get(REFERENCE.get(impl, CONFIGS[0][0]))
        rows.append(summary(impl, comm, settings, servers, runs[impl], reference))
        by_impl[impl] = rows[-1]
    print("%-15s %8s %8s %10s %9s %10s %9s %9s" % (
        "impl", "epoch_s", "cpu_s", "samples/s", "test_acc", "wall_ratio",
        "cpu_ratio", "acc_delta"))
    for r in rows:
        print("%-15s %8.3f %8.3f %10.1f %9.4f %10.3f %9.3f %+9.4f" % (
            r["impl"], r["epoch_s"], r["cpu_epoch_s"], r["samples_per_s"],
            r["test_accuracy"], r["wall_ratio"], r["cpu_ratio"],
            r["accuracy_delta"]))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
