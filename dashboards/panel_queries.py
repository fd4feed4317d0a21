"""Prints the query of every panel of a Grafana dashboard, ready for Prometheus.

    python3 dashboards/panel_queries.py dashboards/gradsync.json

One line per query: the panel title, a tab, and the expr with the dashboard
variables replaced ($job and $instance by .*, $__rate_interval by 1m; the
flags --job, --instance and --rate_interval change them). A panel with
several queries gives several lines with the same title. Rows are skipped;
panels inside collapsed rows are included. Exits 1 when a query uses a
variable it cannot replace.
"""

import argparse
import json
import re
import sys


def iter_queries(dashboard):
    """(title, expr) for every query of every panel, in dashboard order."""
    for panel in dashboard.get("panels") or []:
        nested = panel.get("panels") or []
        for p in [panel] + nested:
            if p.get("type") == "row":
                continue
            for target in p.get("targets") or []:
                expr = target.get("expr")
                if expr and not target.get("hide"):
                    yield p.get("title", ""), expr


def substitute(expr, values):
    """Replaces $name and ${name} by values[name]; raises KeyError on others."""
    def replace(m):
        return values[m.group(1) or m.group(2)]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dashboard")
    parser.add_argument("--job", default=".*")
    parser.add_argument("--instance", default=".*")
    parser.add_argument("--rate_interval", default="1m")
    args = parser.parse_args(argv[1:])
    values = {"job": args.job, "instance": args.instance,
              "__rate_interval": args.rate_interval}
    with open(args.dashboard, encoding="utf-8") as f:
        dashboard = json.load(f)
    for title, expr in iter_queries(dashboard):
        try:
            query = substitute(expr, values)
        except KeyError as e:
            print(f"{title}: unknown variable ${e.args[0]} in {expr}", file=sys.stderr)
            return 1
        one_line = re.sub(r"[\t\r\n]+", " ", query).strip()
        print(f"{title}\t{one_line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
