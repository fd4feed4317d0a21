"""Real multi-process gradsync jobs for the Python tests: N worker processes
of the test interpreter (the venv) on loopback, joined either as torchrun joins them (its
environment; rank 0 hosts the scheduler) or through a gradsync_server
scheduler process (and shards), as gradsync_launch runs them."""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir,
                                    os.pardir))



def _binary(path):
    """A built binary: in Bazel's runfiles, else under bazel-bin/."""
    here = os.path.join(ROOT, path)
    return here if os.path.exists(here) else os.path.join(ROOT, "bazel-bin",
                                                          path)


SERVER = _binary("server/gradsync_server")
LAUNCH = _binary("launcher/gradsync_launch")
# A node is declared dead after 3 s of silence (the product's default
# too): with 1 s, a live shard was once declared dead while the suite ran
# four jobs of Python trainers side by side on 2 cores.
HEARTBEAT_MS = 200
MISSED_HEARTBEATS = 15


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port):
    try:
        with socket.socket() as s:
            s.bind(("", port))
        return True
    except OSError:
        return False


def free_port(span=1):
    """A port that is free now, with the `span - 1` ports after it. It is
    drawn at random below the kernel's ephemeral range: a port found by
    binding port 0 is an ephemeral one, which any other process that binds
    port 0 (tests run side by side) can be handed before the job binds it."""
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(10000, max(10001, low - span))
        if all(_bindable(port + i) for i in range(span)):
            return port


def master_port():
    """A free MASTER_PORT whose successor (gradsync's scheduler under
    torchrun) is free as well."""
    return free_port(span=2)


def base_env(extra=None):
    env = dict(os.environ)
    env.update(PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1",
               # A worker killed at its deadline prints its Python stacks.
               PYTHONFAULTHANDLER="1",
               GRADSYNC_METRICS_BASE_PORT="0",
               GRADSYNC_HEARTBEAT_MS=str(HEARTBEAT_MS),
               GRADSYNC_MISSED_HEARTBEATS=str(MISSED_HEARTBEATS))
    for key in [k for k in env if k.startswith("GRADSYNC_SCHEDULER")] + \
            ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]:
        env.pop(key, None)
    env.update(extra or {})
    return env


def _log(name):
    directory = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or \
        tempfile.gettempdir()
    return open(os.path.join(directory, name + ".log"), "w+")


class Job:
    """Processes of one job; stop() ends every one still running."""

    def __init__(self, tag, extra_env=None):
        self.tag = tag
        self.procs = []
        self.extra_env = dict(extra_env or {})
        self.env = dict(self.extra_env)

    def spawn(self, name, argv, env):
        log = _log("%s.%s" % (self.tag, name))
        proc = subprocess.Popen(argv, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        self.procs.append((name, proc, log))
        return proc

    def start_scheduler(self, workers, servers, server_metrics=False,
                        scheduler_flags=(), server_flags=None):
        """A gradsync_server scheduler; sets GRADSYNC_* for later nodes.
        With `server_metrics`, each shard serves /metrics on a free port
        (self.server_metrics_ports, by start order). `server_flags(s)`:
        more flags for shard s. self.server_argv: each shard's command."""
        port = free_port()
        env = base_env(self.extra_env)
        self.spawn("scheduler", [SERVER, "--role=scheduler", "--port=%d" % port,
                                 "--num_workers=%d" % workers,
                                 "--num_servers=%d" % servers,
                                 "--metrics_port=0"] + list(scheduler_flags), env)
        self.env.update(GRADSYNC_SCHEDULER="127.0.0.1:%d" % port,
                        GRADSYNC_NUM_WORKERS=str(workers),
                        GRADSYNC_NUM_SERVERS=str(servers))
        self.server_metrics_ports = []
        self.server_argv = []
        for s in range(servers):
            port = free_port() if server_metrics else 0
            if server_metrics:
                self.server_metrics_ports.append(port)
            argv = [SERVER, "--role=server", "--metrics_port=%d" % port]
            argv += list(server_flags(s)) if server_flags else []
            self.server_argv.append(argv)
            self.spawn("server%d" % s, argv, base_env(self.env))

    def start_workers(self, argv, workers, torchrun=False):
        port = master_port()
        for rank in range(workers):
            env = base_env(self.env)
            # torchrun's variables; gradsync_launch sets them too, beside
            # its GRADSYNC_* ones.
            env.update(RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(workers), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            if not torchrun:
                env.update(GRADSYNC_RANK=str(rank))
            self.spawn("worker%d" % rank, [sys.executable] + argv, env)

    def wait_workers(self, timeout_s):
        """{rank: (exit code, RESULT dict or None, log text)}."""
        deadline = time.monotonic() + timeout_s
        results = {}
        for name, proc, log in self.procs:
            if not name.startswith("worker"):
                continue
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
                _dump_stacks(proc, log)
            log.seek(0)
            text = log.read()
            found = [json.loads(line[len("RESULT "):])
                     for line in text.splitlines() if line.startswith("RESULT ")]
            results[int(name[len("worker"):])] = (
                code, found[-1] if found else None, text)
        return results

    def stop(self):
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for _, _, log in self.procs:
            log.close()


def _dump_stacks(proc, log):
    """Writes into `log` where a worker past its deadline waits: every
    thread's native stack (gdb, where installed) and Python stack
    (faulthandler, on the SIGABRT that ends it)."""
    log.write("\n--- past its deadline (pid %d): its stacks ---\n" % proc.pid)
    log.flush()
    gdb = shutil.which("gdb")
    if gdb:
        try:
            subprocess.run([gdb, "-p", str(proc.pid), "-batch", "-nx",
                            "-ex", "thread apply all bt 30"],
                           stdout=log, stderr=subprocess.STDOUT, timeout=60)
        except subprocess.TimeoutExpired:
            log.write("(gdb took longer than 60 s)\n")
    log.flush()
    proc.send_signal(signal.SIGABRT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def run_workers(tag, argv, workers=4, torchrun=True, servers=0,
                timeout_s=90, extra_env=None):
    """Runs a job to its end; returns wait_workers()'s map. `extra_env`
    goes to every process (servers too)."""
    job = Job(tag, extra_env)
    try:
        if not torchrun:
            job.start_scheduler(workers, servers)
        job.start_workers(argv, workers, torchrun)
        return job.wait_workers(timeout_s)
    finally:
        job.stop()


def run_ok(worker, scenario, workers, **kwargs):
    """Runs `scenario` of the worker script `worker` on `workers` ranks
    (run_workers' keyword arguments); asserts every rank exited 0 with a
    RESULT and returns {rank: RESULT dict}."""
    results = run_workers(scenario, [worker, scenario], workers, **kwargs)
    for rank, (code, result, _) in results.items():
        assert code == 0 and result is not None, \
            "worker %d failed\n%s" % (rank, describe(results))
    return {rank: result for rank, (_, result, _) in results.items()}


def launch(argv, workers, servers, timeout_s, extra_env=None, flags=()):
    """Runs `argv` as a gradsync_launch job (more launcher `flags`, such as
    "--min_workers=3"); returns (exit code, output)."""
    command = [LAUNCH, "--workers=%d" % workers, "--servers=%d" % servers,
               "--metrics_port=0"] + list(flags) + ["--"] + argv
    try:
        done = subprocess.run(command, env=base_env(extra_env),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode("utf-8", "replace")
    return done.returncode, done.stdout.decode("utf-8", "replace")


def json_lines(output):
    """The JSON objects printed by the job's processes, each line prefixed
    by its process ("[worker 0] {...}", torchrun's "[default0]:{...}")."""
    found = []
    for line in output.splitlines():
        prefix, _, text = line.partition("]")
        text = text.lstrip(": ")
        if prefix.startswith("[") and text.startswith("{"):
            found.append(json.loads(text))
    return found


def describe(results):
    """The logs of the workers, for a failing assertion's message."""
    return "\n".join("--- worker %d (exit %s)\n%s" % (r, c, text[-3000:])
                     for r, (c, _, text) in sorted(results.items()))
