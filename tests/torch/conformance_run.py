"""Runs PyTorch's own distributed tests (tests/torch/conformance.py) for one
backend, or for gradsync and gloo side by side, and counts them by kind.

    .venv/bin/python tests/torch/conformance_run.py --compare --out=DIR
        every test for gloo (--reuse_gloo: the outcomes an earlier run left
        in DIR), then for gradsync; DIR/<backend>.txt lists each
        test's outcome, DIR/summary.txt the counts per kind, and gradsync's
        failures among what gloo passes
    .venv/bin/python tests/torch/conformance_run.py --backend=gradsync \\
        --only=tests/torch/conformance_pass.txt
        the tests listed (one a line, '#' comments); exits 1 unless every
        one passed

WORLD_SIZE is 3 unless --world_size says otherwise (groups of torch's tests
take ranks 1 and 2). Each test is bounded by torch's harness
(DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, 60 s here) and the whole run by
--timeout_s.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.join(HERE, "conformance.py")
CLASS = "TestDistBackendWithSpawn"
P2P = re.compile(r"send|recv|isend|irecv")
COLLECTIVE = re.compile(r"all_reduce|all_gather|all_to_all|broadcast|reduce|"
                        r"gather|scatter|barrier|coalesc|object")
GROUP = re.compile(r"group|subgroup|get_rank|get_backend|destroy|Backend_enum")
DDP = re.compile(r"ddp|DistributedDataParallel|DDP|static_graph|sync_bn|"
                 r"SyncBatchNorm|unused|no_sync|grads_same|model_across|"
                 r"bucket|graph|hook|join|uneven|output_unused|undefined_grad|"
                 r"DistributedSampler|skip_all_reduce")


def kind(name):
    """A test's kind: p2p, monitored_barrier, collective, group, ddp or
    other (the issue's count is over collective, group and ddp)."""
    if "monitored_barrier" in name:
        return "monitored_barrier"
    if P2P.search(name) and "all_reduce" not in name:
        return "p2p"
    if DDP.search(name):
        return "ddp"
    if GROUP.search(name) and not COLLECTIVE.search(name.replace("group", "")):
        return "group"
    if COLLECTIVE.search(name):
        return "collective"
    return "other"


def all_tests(world_size):
    """Every test name of torch's _DistTestBase (whose module reads
    BACKEND and WORLD_SIZE when imported; each run sets its own)."""
    os.environ.setdefault("BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    from torch.testing._internal.distributed.distributed_test import \
        DistributedTest
    return sorted(n for n in dir(DistributedTest._DistTestBase)
                  if n.startswith("test_"))


def read_names(path):
    with open(path) as f:
        return [n for n in (line.split("#")[0].strip() for line in f) if n]


def run(backend, names, world_size, timeout_s, log):
    """{test name: passed | failed | skipped} for `backend`."""
    junit = tempfile.mktemp(suffix=".xml")
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world_size),
               PYTHONPATH=os.pathsep.join(
                   [os.path.join(HERE, os.pardir, os.pardir, "python"), HERE,
                    os.environ.get("PYTHONPATH", "")]))
    env.pop("TEMP_DIR", None)
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            "-W", "ignore::DeprecationWarning", "--junitxml", junit] + \
        ["%s::%s::%s" % (MODULE, CLASS, n) for n in names]
    with open(log, "w") as out:
        try:
            subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                           timeout=timeout_s)
        except subprocess.TimeoutExpired:
            out.write("\nconformance_run: the run passed --timeout_s=%d\n"
                      % timeout_s)
    outcome = {n: "failed" for n in names}  # not reported: did not finish
    if os.path.exists(junit):
        for case in ET.parse(junit).iter("testcase"):
            name = case.get("name")
            if case.find("skipped") is not None:
                outcome[name] = "skipped"
            elif case.find("failure") is not None or case.find("error") is not None:
                outcome[name] = "failed"
            else:
                outcome[name] = "passed"
        os.unlink(junit)
    return outcome


def write_outcomes(path, outcome):
    with open(path, "w") as f:
        for name in sorted(outcome):
            f.write("%s %s %s\n" % (outcome[name], kind(name), name))


def compare(args):
    os.makedirs(args.out, exist_ok=True)
    names = all_tests(args.world_size)
    results = {}
    for backend in ("gloo", "gradsync"):
        listed = os.path.join(args.out, backend + ".txt")
        if backend == "gloo" and args.reuse_gloo and os.path.exists(listed):
            with open(listed) as f:  # an earlier run's outcomes
                results[backend] = {n: o for o, _, n in
                                    (line.split() for line in f)}
            continue
        results[backend] = run(backend, names, args.world_size, args.timeout_s,
                               os.path.join(args.out, backend + ".log"))
        write_outcomes(listed, results[backend])
    lines = ["world size %d, %d tests" % (args.world_size, len(names))]
    counted = collections.Counter()
    for name in names:
        k = kind(name)
        g, o = results["gloo"][name], results["gradsync"][name]
        counted[(k, "gloo " + g)] += 1
        counted[(k, "gradsync " + o)] += 1
        if g == "passed":
            counted[(k, "both pass" if o == "passed" else "gloo only")] += 1
    for k in ("collective", "group", "ddp", "p2p", "monitored_barrier", "other"):
        lines.append("%-18s " % k + ", ".join(
            "%s %d" % (label, counted[(k, label)]) for label in
            ("gloo passed", "gradsync passed", "both pass", "gloo only")))
    core = [n for n in names if kind(n) in ("collective", "group", "ddp")
            and results["gloo"][n] == "passed"]
    ours = [n for n in core if results["gradsync"][n] == "passed"]
    lines.append("collective+group+ddp: gradsync passes %d of the %d gloo "
                 "passes (%.1f%%)" % (len(ours), len(core),
                                      100.0 * len(ours) / max(1, len(core))))
    lines.append("gloo passes, gradsync does not:")
    lines += ["  %s %s (%s)" % (kind(n), n, results["gradsync"][n])
              for n in names if results["gloo"][n] == "passed"
              and results["gradsync"][n] != "passed"]
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def only(args):
    names = read_names(args.only)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out or tempfile.mkdtemp(), args.backend + ".log")
    outcome = run(args.backend, names, args.world_size, args.timeout_s, log)
    failed = [n for n in names if outcome[n] != "passed"]
    for n in names:
        print("%s %s" % (outcome[n], n))
    print("%d of %d listed tests passed for %s (log: %s)"
          % (len(names) - len(failed), len(names), args.backend, log))
    if failed:
        with open(log) as f:
            print(f.read()[-20000:])
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="gradsync")
    parser.add_argument("--world_size", type=int, default=3)
    parser.add_argument("--only", help="a file of test names to run")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--reuse_gloo", action="store_true",
                        help="--compare takes gloo's outcomes from an "
                             "earlier run's OUT/gloo.txt")
    parser.add_argument("--out", help="the folder for logs and lists")
    parser.add_argument("--timeout_s", type=int, default=4 * 3600)
    args = parser.parse_args()
    if args.compare:
        if not args.out:
            parser.error("--compare needs --out")
        return compare(args)
    if not args.only:
        parser.error("give --only=FILE or --compare")
    return only(args)


if __name__ == "__main__":
    sys.exit(main())
