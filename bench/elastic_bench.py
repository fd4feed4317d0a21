"""A worker lost mid-epoch: gradsync's elastic job against torchrun's
restart, 4 workers of the Fashion-MNIST CNN on this machine, same seed.

    bazel run //bench:elastic_bench -- [--epochs=2] [--reps=3]

gradsync: examples/torch_elastic.py under gradsync_launch --min_workers=3
(gradsync.torch.elastic: the 3 survivors agree on the step, take the
state of one of them and go on), on the ring and (--paths=ring,ps) on 2
parameter-server shards that average (ps_mode=sync); demo-ring and demo-ps
run the demo's trainer instead (examples/fmnist_trainer, the MLP, 3
epochs; build with --config=opt). torchrun: bench/elastic_peer.py under
torchrun --max_restarts=1 (c10d rendezvous on loopback, DDP over gloo, a
checkpoint every epoch): every worker restarts and resumes from the last
checkpoint. In both the worker of rank 2 SIGKILLs itself before step
--kill_step (default: the middle of the second epoch). Measured per run,
from the kill (wall clock): (a) kill_to_step_s, until every worker that
goes on has completed its next step; back_at_kill_s, until the step the
kill interrupted is completed (for torchrun: again, after redoing the
steps since its checkpoint); (c) the final test accuracy; with --rejoin
(gradsync_launch --restarts=1) (b) start_to_step_s, from the replacement
process's start to its first completed step in the job. Prints a
table and one JSON line per implementation, medians over --reps
interleaved repetitions, and the ratio of torchrun's (a) to gradsync's.
Heartbeat settings and torchrun's --monitor_interval are the defaults
unless given.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
import job  # noqa: E402  (the launcher's path, output parsing)

WORKERS = 4
KILLED = 2
STEPS_PER_EPOCH = 60000 // (WORKERS * 64)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--kill_step", type=int, default=STEPS_PER_EPOCH * 3 // 2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--heartbeat_ms", type=int, default=0)
    p.add_argument("--missed_heartbeats", type=int, default=0)
    p.add_argument("--monitor_interval", type=float, default=0)
    p.add_argument("--rejoin", action="store_true",
                   help="gradsync_launch --restarts=1: the killed worker is "
                        "started again and joins the running job")
    p.add_argument("--paths", default="ring",
                   help="gradsync's runs, comma-separated: ring, ps (the torch "
                        "example), demo-ring, demo-ps (the demo's trainer)")
    p.add_argument("--demo_epochs", type=int, default=3)
    p.add_argument("--demo_kill_step", type=int, default=0,
                   help="default: the middle of the demo's second epoch")
    p.add_argument("--timeout_s", type=int, default=900)
    return p.parse_args(argv)


def env(args):
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    if args.heartbeat_ms:
        e["GRADSYNC_HEARTBEAT_MS"] = str(args.heartbeat_ms)
    if args.missed_heartbeats:
        e["GRADSYNC_MISSED_HEARTBEATS"] = str(args.missed_heartbeats)
    return e


def execute(name, command, args, extra_env=None):
    done = subprocess.run(command, env=dict(env(args), **(extra_env or {})),
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=args.timeout_s)
    output = done.stdout.decode("utf-8", "replace")
    lines = job.json_lines(output)
    killed = [r["killed_at"] for r in lines if "killed_at" in r]
    if done.returncode != 0 or len(killed) != 1:
        sys.exit("%s failed (exit %d):\n%s" % (name, done.returncode,
                                              output[-4000:]))
    return killed[0], [r for r in lines if "test_accuracy" in r], output


def demo_command(args):
    steps_per_epoch = 60000 // (WORKERS * 64)
    kill_step = args.demo_kill_step or steps_per_epoch * 3 // 2
    trainer = os.path.join(ROOT, "examples", "fmnist_trainer")
    return [trainer, "--epochs=%d" % args.demo_epochs, "--kill_rank=%d" % KILLED,
            "--kill_step=%d" % kill_step]


def run_gradsync(args, path):
    demo = path.startswith("demo-")
    path = path[len("demo-"):] if demo else path
    servers = 2 if path == "ps" else 0
    extra_env = {"GRADSYNC_PATH": "ps", "GRADSYNC_PS_MODE": "sync"} if servers else {}
    command = [job.LAUNCH, "--workers=%d" % WORKERS, "--servers=%d" % servers,
               "--min_workers=%d" % (WORKERS - 1), "--metrics_port=0"]
    command += ["--restarts=1"] if args.rejoin else []
    command += ["--"]
    if demo:
        command += demo_command(args) + ["--mode=" + path]
    else:
        command += [sys.executable, os.path.join(ROOT, "examples", "torch_elastic.py"),
                    "--epochs=%d" % args.epochs, "--kill_rank=%d" % KILLED,
                    "--kill_step=%d" % args.kill_step]
    killed, results, output = execute("gradsync", command, args, extra_env)
    if demo:  # the workers' elastic lines; the accuracy on rank 0's result
        accuracy = [r["test_accuracy"] for r in results if "mode" in r]
        results = [dict(r, test_accuracy=accuracy[0] if accuracy else -1)
                   for r in job.json_lines(output) if r.get("elastic")]
    survivors = [r for r in results if not r["joined"]]
    joiners = [r for r in results if r["joined"]]
    if len(survivors) != WORKERS - 1 or len(joiners) != int(args.rejoin):
        sys.exit("gradsync: %d results:\n%s" % (len(results), output[-4000:]))
    kill_to_step = max(r["recovered_at"][0] for r in survivors) - killed
    row = {"kill_to_step_s": kill_to_step, "back_at_kill_s": kill_to_step,
           "test_accuracy": results[0]["test_accuracy"]}
    if joiners:
        row["start_to_step_s"] = joiners[0]["recovered_at"][0] - \
            joiners[0]["started_at"]
    return row


def run_torchrun(args):
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "torch.distributed.run",
                   "--nnodes=1", "--nproc_per_node=%d" % WORKERS,
                   "--max_restarts=1", "--rdzv_backend=c10d",
                   "--rdzv_endpoint=127.0.0.1:%d" % job.free_port(),
                   # --redirects/--tee: this torchrun reads its default "0"
                   # as no value under Python 3.11 and fails.
                   "--redirects=1", "--tee=1"]
        if args.monitor_interval:
            command.append("--monitor_interval=%g" % args.monitor_interval)
        command += [os.path.join(ROOT, "bench", "elastic_peer.py"),
                    "--checkpoint=" + os.path.join(tmp, "ckpt.pt"),
                    "--epochs=%d" % args.epochs, "--kill_rank=%d" % KILLED,
                    "--kill_step=%d" % args.kill_step]
        killed, results, output = execute("torchrun", command, args)
    restarted = [r for r in results if r["restart"] == 1]
    if len(restarted) != WORKERS:
        sys.exit("torchrun: %d restarted results:\n%s" % (len(restarted),
                                                          output[-4000:]))
    return {"kill_to_step_s": max(r["first_step_at"] for r in restarted) - killed,
            "back_at_kill_s": max(r["kill_step_at"] for r in restarted) - killed,
            "test_accuracy": restarted[0]["test_accuracy"],
            "steps_redone": args.kill_step - restarted[0]["resumed_step"]}


def main(argv):
    args = parse_args(argv)
    impls = [("gradsync-" + path, lambda a, path=path: run_gradsync(a, path))
             for path in args.paths.split(",")]
    impls.append(("torchrun", run_torchrun))
    runs = {name: [] for name, _ in impls}
    for rep in range(args.reps):
        for name, fn in impls:
            runs[name].append(fn(args))
            print("rep %d %s %s" % (rep, name, json.dumps(runs[name][-1])),
                  file=sys.stderr, flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for name, rs in runs.items()}
    print("%-20s %16s %16s %14s" % ("impl", "kill_to_step_s", "back_at_kill_s",
                                     "test_accuracy"))
    for name, m in med.items():
        print("%-20s %16.2f %16.2f %14.4f" % (name, m["kill_to_step_s"],
                                               m["back_at_kill_s"],
                                               m["test_accuracy"]))
    ratios = {name: med["torchrun"]["kill_to_step_s"] / m["kill_to_step_s"]
              for name, m in med.items() if name != "torchrun"}
    for name, ratio in ratios.items():
        print("torchrun / %s kill_to_step: %.1fx" % (name, ratio))
        if args.rejoin:
            print("%s replacement start_to_step_s: %.2f" %
                  (name, med[name]["start_to_step_s"]))
    for name, m in med.items():
        row = {"impl": name, "reps": args.reps, "epochs": args.epochs,
               "kill_step": args.kill_step}
        row.update({k: round(v, 4) for k, v in m.items()})
        if name in ratios:
            row["torchrun_kill_to_step_ratio"] = round(ratios[name], 2)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
