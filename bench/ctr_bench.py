#!/usr/bin/env python3
"""examples/torch_ctr.py side by side: the tables on gradsync's shards
against every worker holding them in DDP over gloo (sparse gradients
all-gathered), run after run alternating, same data and model.

    bazel build --config=opt //launcher:gradsync_launch //server:gradsync_server \\
        //python:libgradsync.so
    .venv/bin/python bench/ctr_bench.py [--workers=4] [--servers=2] [--reps=3]
        [--vocab=2000000] [--tables=2] [--steps=300] [--ps_mode=sync] [--skip_anchor]
        [--prefetch]

Both run with OMP_NUM_THREADS=1 (as torchrun sets it for several
processes a node). Prints each run's samples/s, AUC and peak RSS of rank
0, then the medians, the ratio gradsync / anchor and one JSON line. With
--prefetch, gradsync runs a third time each round with the example's
--prefetch (the next step's rows pulled during the optimizer step).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))


def run(variant, args):
    comm, _, prefetch = variant.partition("+")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "python"),
               GRADSYNC_EMBEDDING_OPTIMIZER="adagrad", GRADSYNC_EMBEDDING_LR=str(args.emb_lr),
               GRADSYNC_METRICS_BASE_PORT="0", GRADSYNC_PS_MODE=args.ps_mode)
    if args.ps_mode != "sync":
        # The shards refuse async and ssp without a dense optimizer, which
        # this job (dense keys all-reduced, not on the shards) never uses.
        env.setdefault("GRADSYNC_OPTIMIZER", "sgd")
    servers = args.servers if comm == "gradsync" else 0
    command = [os.path.join(ROOT, "bazel-bin/launcher/gradsync_launch"),
               "--workers=%d" % args.workers, "--servers=%d" % servers, "--metrics_port=0", "--",
               sys.executable, os.path.join(ROOT, "examples/torch_ctr.py"), "--comm=" + comm,
               "--vocab=%d" % args.vocab, "--tables=%d" % args.tables, "--steps=%d" % args.steps,
               "--emb_lr=%g" % args.emb_lr] + (["--prefetch"] if prefetch else [])
    out = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=1800)
    for line in out.stdout.splitlines():
        _, _, text = line.partition("] ")
        if text.startswith("{") and '"comm"' in text:
            return json.loads(text)
    log = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ctr_bench_%s.log" % comm)
    with open(log, "w") as f:
        f.write(out.stdout)
    sys.exit("ctr_bench: %s run failed (exit %d), its output in %s; its end:\n%s"
             % (comm, out.returncode, log, out.stdout[-3000:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=2000000)
    ap.add_argument("--tables", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--emb_lr", type=float, default=0.05)
    ap.add_argument("--ps_mode", default="sync", choices=["sync", "async", "ssp"],
                    help="the shards' mode for the tables (ssp: staleness 0 unless "
                         "GRADSYNC_STALENESS is set)")
    ap.add_argument("--skip_anchor", action="store_true",
                    help="gradsync only (a table the anchor's workers cannot hold)")
    ap.add_argument("--prefetch", action="store_true",
                    help="gradsync with the example's --prefetch too")
    args = ap.parse_args()
    comms = ["gradsync"] + (["gradsync+prefetch"] if args.prefetch else []) + \
        ([] if args.skip_anchor else ["ddp-gloo"])
    runs = {c: [] for c in comms}
    for rep in range(args.reps):
        for comm in comms:
            r = run(comm, args)
            runs[comm].append(r)
            print("rep %d %-17s %10.0f samples/s  auc %.4f (best %.4f)  rank 0 rss %7.0f MB"
                  % (rep, comm, r["samples_per_s"], r["auc"], r["best_auc"], r["peak_rss_mb"]),
                  flush=True)
    summary = {"bench": "ctr", "ps_mode": args.ps_mode, "workers": args.workers,
               "servers": args.servers,
               "vocab": args.vocab, "tables": args.tables, "steps": args.steps}
    for comm in comms:
        key = comm.replace("-", "_").replace("+", "_")
        summary[key + "_samples_per_s"] = statistics.median(r["samples_per_s"] for r in runs[comm])
        summary[key + "_auc"] = statistics.median(r["auc"] for r in runs[comm])
        summary[key + "_rss_mb"] = statistics.median(r["peak_rss_mb"] for r in runs[comm])
    if not args.skip_anchor:
        summary["ratio"] = summary["gradsync_samples_per_s"] / summary["ddp_gloo_samples_per_s"]
        summary["auc_difference"] = summary["gradsync_auc"] - summary["ddp_gloo_auc"]
        print("median: gradsync %.0f, ddp-gloo %.0f samples/s: %.2fx; AUC %+.4f"
              % (summary["gradsync_samples_per_s"], summary["ddp_gloo_samples_per_s"],
                 summary["ratio"], summary["auc_difference"]))
    if args.prefetch:
        summary["prefetch_ratio"] = (summary["gradsync_prefetch_samples_per_s"] /
                                     summary["gradsync_samples_per_s"])
        print("median: gradsync with prefetch %.0f samples/s: %.2fx without"
              % (summary["gradsync_prefetch_samples_per_s"], summary["prefetch_ratio"]))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
