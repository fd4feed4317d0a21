"""A real Prometheus server scrapes a small real gradsync job.

The job (gradsync_launch): the scheduler, 2 parameter-server shards in SSP
mode with a server-side optimizer and checkpoints every second, and 2
Fashion-MNIST trainers. Prometheus (Debian's package, on loopback, a
temporary data directory) scrapes every process every second with the
dashboard's recording and alert rules loaded.

The test waits for what it needs, not for time: Prometheus's target
discovery sends its first update about 5 s after start, so the job starts
only once Prometheus has tried every target (/api/v1/targets: lastScrape
set); the job then trains until Prometheus has scraped every process up at
least MIN_UP_SCRAPES times and seen every worker's completed step change
at least twice, and is then stopped as Ctrl-C stops it (SIGINT to the
launcher, which must exit 128 + SIGINT having stopped every process).

Checks:
  - every process's exposition passes `promtool check metrics` and carries
    gradsync_build_info and the process_* families;
  - every target was up and every rule group loaded without error;
  - every query of every dashboard panel, with the dashboard's variables
    filled in as Grafana would, returns data (a series with at least one
    number) over the job's lifetime.

Usage: prometheus_live_test.py (inside Bazel: runfiles are found through
$TEST_SRCDIR; outside, from the repository root after bazel build).
"""

import datetime
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

SCRAPE_S = 1
MIN_UP_SCRAPES = 3
NEVER = "0001-01-01T00:00:00Z"  # lastScrape of a target not scraped yet


def runfile(path):
    base = os.environ.get("TEST_SRCDIR")
    if base:
        return os.path.join(base, os.environ.get("TEST_WORKSPACE", "gradsync"), path)
    for root in ("bazel-bin", "."):
        if os.path.exists(os.path.join(root, path)):
            return os.path.join(root, path)
    return path


def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def free_base(span):
    """A base port with base .. base + span - 1 all free."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - span)
        if all(port_free(base + i) for i in range(span)):
            return base
    raise RuntimeError("no free range of %d ports" % span)


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8")


def api(prom, path, **params):
    body = json.loads(get("%s/api/v1/%s?%s" % (prom, path, urllib.parse.urlencode(params))))
    if body.get("status") != "success":
        raise RuntimeError("%s: %s" % (path, body))
    return body["data"]


def wait_for(what, check, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError, RuntimeError):
            pass
        time.sleep(0.2)
    raise AssertionError("timed out after %ds waiting for %s" % (timeout_s, what))


def sample(text, name):
    """The value of an unlabelled sample, or None."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def scraped_once(prom, instances):
    """Whether Prometheus has tried to scrape every instance (up or not)."""
    tried = {t["labels"]["instance"] for t in api(prom, "targets", state="active")["activeTargets"]
             if t.get("lastScrape", NEVER) != NEVER}
    return instances <= tried


def per_instance(prom, query):
    """{instance: value} of an instant query."""
    return {r["metric"]["instance"]: float(r["value"][1])
            for r in api(prom, "query", query=query)["result"]}


def enough_scrapes(prom, instances, workers):
    """Every instance up in at least MIN_UP_SCRAPES scrapes and reported up
    by /api/v1/targets now; every worker's last completed step stored with
    at least two changes (so rates over training have two samples)."""
    health = {t["labels"]["instance"]: t["health"]
              for t in api(prom, "targets", state="active")["activeTargets"]}
    ups = per_instance(prom, "sum_over_time(up[10m])")
    steps = per_instance(prom, "changes(gradsync_client_last_completed_step[10m])")
    return (all(health.get(i) == "up" and ups.get(i, 0) >= MIN_UP_SCRAPES for i in instances)
            and all(steps.get(i, 0) >= 2 for i in workers))


def still_running(job):
    """True while the job runs; an AssertionError (ending the wait) once it ended."""
    code = job.poll()
    if code is not None:
        raise AssertionError("the job ended (exit %d) before the scrapes the test needs" % code)
    return True


def evaluated_after(group, when):
    """Whether a rule group of /api/v1/rules was last evaluated after `when`."""
    stamp = group.get("lastEvaluation", NEVER)
    if stamp == NEVER:
        return False
    # Prometheus writes nanoseconds; datetime takes microseconds.
    head, _, frac = stamp.rstrip("Z").partition(".")
    parsed = datetime.datetime.fromisoformat(head + "." + (frac + "000000")[:6] + "+00:00")
    return parsed.timestamp() > when


class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, message):
        if not ok:
            self.items.append(message)
            print("FAIL: " + message, flush=True)


def main():
    sys.path.insert(0, os.path.dirname(runfile("dashboards/panel_queries.py")))
    import panel_queries  # pylint: disable=import-outside-toplevel

    launch = runfile("launcher/gradsync_launch")
    server = runfile("server/gradsync_server")
    trainer = runfile("examples/fmnist_trainer")
    dashboard_path = runfile("dashboards/gradsync.json")
    rules = [runfile("dashboards/recording_rules.yml"), runfile("dashboards/alert_rules.yml")]
    for f in [launch, server, trainer, dashboard_path] + rules:
        if not os.path.exists(f):
            raise SystemExit("missing %s" % f)
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        raise SystemExit("prometheus and promtool are needed (Debian package prometheus)")
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        raise SystemExit("Fashion-MNIST is needed (Debian package dataset-fashion-mnist)")

    work = tempfile.mkdtemp(prefix="gradsync_prom_")
    base = free_base(14)
    prom_port = free_base(1)
    targets = {"scheduler": base, "server 0": base + 1, "server 1": base + 2,
               "worker 0": base + 10, "worker 1": base + 11}
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w", encoding="utf-8") as f:
        f.write("global:\n  scrape_interval: %ds\n  scrape_timeout: %ds\n"
                "  evaluation_interval: %ds\n" % (SCRAPE_S, SCRAPE_S, SCRAPE_S))
        f.write("rule_files:\n" + "".join("  - %s\n" % os.path.abspath(r) for r in rules))
        f.write("scrape_configs:\n  - job_name: gradsync\n    static_configs:\n"
                "      - targets: [%s]\n" %
                ", ".join("'127.0.0.1:%d'" % p for p in targets.values()))
    prom_log = open(os.path.join(work, "prometheus.log"), "w", encoding="utf-8")
    prometheus = subprocess.Popen(
        ["prometheus", "--config.file=" + config, "--storage.tsdb.path=" + work + "/data",
         "--web.listen-address=127.0.0.1:%d" % prom_port, "--log.level=warn"],
        stdout=prom_log, stderr=subprocess.STDOUT)
    prom = "http://127.0.0.1:%d" % prom_port
    failures = Failures()
    try:
        wait_for("Prometheus to be ready", lambda: "Ready" in get(prom + "/-/ready"), 60)
        instances = {"127.0.0.1:%d" % p for p in targets.values()}
        workers = {"127.0.0.1:%d" % p for n, p in targets.items() if n.startswith("worker")}
        wait_for("Prometheus to try every target once (target discovery)",
                 lambda: scraped_once(prom, instances), 60)

        env = dict(os.environ,
                   GRADSYNC_PS_MODE="ssp", GRADSYNC_STALENESS="2",
                   GRADSYNC_OPTIMIZER="momentum", GRADSYNC_LR="0.025",
                   GRADSYNC_CHECKPOINT_DIR=os.path.join(work, "checkpoints"),
                   GRADSYNC_CHECKPOINT_INTERVAL_S="1")
        os.makedirs(env["GRADSYNC_CHECKPOINT_DIR"])
        job_log = open(os.path.join(work, "job.log"), "w", encoding="utf-8")
        start = time.time()
        job = subprocess.Popen(
            [launch, "--workers=2", "--servers=2", "--port=0",
             "--metrics_port=%d" % base, "--server_binary=" + server,
             "--log_dir=" + os.path.join(work, "logs"), "--",
             trainer, "--path=ps", "--epochs=1000", "--batch=32", "--mode=ps-ssp2"],
            env=env, stdout=job_log, stderr=subprocess.STDOUT)

        # Each process's exposition, taken while the job trains.
        expositions = {}

        def all_scraped():
            for name, port in targets.items():
                text = get("http://127.0.0.1:%d/metrics" % port, timeout=2)
                if name.startswith("worker"):
                    step = sample(text, "gradsync_client_last_completed_step")
                    if step is None or step < 20:
                        return False
                expositions[name] = text
            return len(expositions) == len(targets)

        try:
            wait_for("every process to serve /metrics with training under way", all_scraped, 120)
            wait_for("Prometheus to scrape every process %d times, every worker's step "
                     "changing twice" % MIN_UP_SCRAPES,
                     lambda: still_running(job) and enough_scrapes(prom, instances, workers), 120)
        except AssertionError:
            job.kill()
            with open(os.path.join(work, "job.log"), encoding="utf-8") as f:
                print(f.read()[-4000:])
            raise
        job.send_signal(signal.SIGINT)
        code = job.wait(timeout=120)
        end = time.time()
        job_log.close()
        with open(os.path.join(work, "job.log"), encoding="utf-8") as f:
            log = f.read()
        failures.check(code == 128 + signal.SIGINT,
                       "the job, stopped by SIGINT, exited %d:\n%s" % (code, log[-3000:]))
        print("job ran %.1f s" % (end - start), flush=True)
        wait_for("every rule group to be evaluated after the job",
                 lambda: all(evaluated_after(g, end) for g in api(prom, "rules")["groups"]), 60)

        for name, text in sorted(expositions.items()):
            check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                                   capture_output=True, check=False)
            failures.check(check.returncode == 0, "%s: promtool check metrics: %s" %
                           (name, (check.stdout + check.stderr).decode()))
            for family in ("gradsync_build_info", "process_cpu_seconds_total",
                           "process_resident_memory_bytes", "process_open_fds",
                           "process_start_time_seconds"):
                failures.check(family in text, "%s: no %s" % (name, family))
            if name.startswith("worker"):
                # The one plan of the epoch: the PS path, both workers on one
                # host over shared-memory segments, one lane in rank order.
                plan = [line for line in text.splitlines()
                        if line.startswith("gradsync_client_collectives{")]
                failures.check(
                    len(plan) == 1 and plan[0].endswith(" 1") and all(
                        label in plan[0] for label in
                        ('path="ps"', 'algorithm="ring"', 'lanes="1"', 'order="rank"',
                         'same_host="segments"')),
                    "%s: gradsync_client_collectives %s" % (name, plan))

        up = api(prom, "query_range", query="up", start=start, end=end, step=SCRAPE_S)
        seen = {r["metric"]["instance"] for r in up["result"]
                if any(v == "1" for _, v in r["values"])}
        for name, port in targets.items():
            failures.check("127.0.0.1:%d" % port in seen, "%s was never up" % name)
        for group in api(prom, "rules")["groups"]:
            for rule in group["rules"]:
                failures.check(rule.get("health") in ("ok", "unknown"),
                               "rule %s: %s %s" % (rule["name"], rule.get("health"),
                                                   rule.get("lastError", "")))

        with open(dashboard_path, encoding="utf-8") as f:
            dashboard = json.load(f)
        values = {"job": "gradsync", "instance": ".*", "__rate_interval": "%ds" % (4 * SCRAPE_S)}
        queries = list(panel_queries.iter_queries(dashboard))
        failures.check(len(queries) >= 10, "only %d panel queries" % len(queries))
        for title, expr in queries:
            query = panel_queries.substitute(expr, values)
            data = api(prom, "query_range", query=query, start=start, end=end + SCRAPE_S,
                       step=SCRAPE_S)
            numbers = [float(v) for r in data["result"] for _, v in r["values"]
                       if not math.isnan(float(v))]
            print("%-45s %3d series %5d points" % (title, len(data["result"]), len(numbers)),
                  flush=True)
            failures.check(len(numbers) > 0, "panel '%s' returned no data: %s" % (title, query))
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        prom_log.close()
        if failures.items:
            print("logs in " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures.items:
        print("%d failures" % len(failures.items))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
