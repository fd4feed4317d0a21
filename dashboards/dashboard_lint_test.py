"""The dashboard passes the lint, and the lint rejects each broken variant."""

import contextlib
import copy
import io
import json
import os
import sys
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dashboard_lint  # noqa: E402
import panel_queries  # noqa: E402

DASHBOARD_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gradsync.json")


def load_dashboard():
    with open(DASHBOARD_PATH, encoding="utf-8") as f:
        return json.load(f)


def panel(dashboard, title):
    for p in dashboard_lint.iter_panels(dashboard):
        if p.get("title") == title:
            return p
    raise KeyError(title)


def variable(dashboard, name):
    for v in dashboard["templating"]["list"]:
        if v["name"] == name:
            return v
    raise KeyError(name)


class DashboardTest(unittest.TestCase):

    def test_dashboard_passes(self):
        self.assertEqual(dashboard_lint.lint(load_dashboard()), [])

    def test_every_issue_panel_is_required(self):
        titles = {p.get("title") for p in dashboard_lint.iter_panels(load_dashboard())}
        for title in dashboard_lint.REQUIRED_PANELS:
            self.assertIn(title, titles)

    def test_quantile_panels_show_p50_p90_p99_by_op_and_path(self):
        dashboard = load_dashboard()
        for q, name in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")):
            expr = panel(dashboard, f"Sync latency {name} by op and path")["targets"][0]["expr"]
            self.assertIn(f"histogram_quantile({q}, sum by (op, path, le)", expr)
            self.assertIn("gradsync_client_sync_latency_seconds_bucket", expr)

    def test_heatmaps_use_prometheus_buckets(self):
        dashboard = load_dashboard()
        for title in ("Sync latency heatmap", "Push staleness distribution"):
            p = panel(dashboard, title)
            self.assertEqual(p["type"], "heatmap")
            self.assertFalse(p["options"]["calculate"])
            self.assertEqual(p["targets"][0]["format"], "heatmap")
            self.assertIn("sum by (le)", p["targets"][0]["expr"])


class LintRejectsTest(unittest.TestCase):
    """Each case breaks one rule in a copy of the dashboard."""

    def assertRejected(self, mutate, expected):
        dashboard = copy.deepcopy(load_dashboard())
        mutate(dashboard)
        problems = dashboard_lint.lint(dashboard)
        self.assertTrue(any(expected in p for p in problems),
                        f"expected a problem containing {expected!r}, got {problems}")

    def set_expr(self, title, old, new, index=0):
        def mutate(d):
            target = panel(d, title)["targets"][index]
            self.assertIn(old, target["expr"])
            target["expr"] = target["expr"].replace(old, new, 1)
        return mutate

    def test_uid(self):
        self.assertRejected(lambda d: d.update(uid="abc123"), "uid is 'abc123'")
        self.assertRejected(lambda d: d.pop("uid"), "uid is None")

    def test_schema_version(self):
        self.assertRejected(lambda d: d.update(schemaVersion=39), "schemaVersion is 39")
        self.assertRejected(lambda d: d.update(schemaVersion="38"), "schemaVersion is '38'")
        self.assertRejected(lambda d: d.pop("schemaVersion"), "schemaVersion is None")

    def test_id_must_be_null(self):
        self.assertRejected(lambda d: d.update(id=7), "id must be null")

    def test_datasource_variable(self):
        def drop(d):
            d["templating"]["list"] = [v for v in d["templating"]["list"]
                                       if v["name"] != "datasource"]
        self.assertRejected(drop, "variable `datasource`")
        self.assertRejected(lambda d: variable(d, "datasource").update(query="loki"),
                            "variable `datasource`")

    def test_job_and_instance_variables(self):
        def drop_job(d):
            d["templating"]["list"] = [v for v in d["templating"]["list"] if v["name"] != "job"]
        self.assertRejected(drop_job, "query variable `job` missing")
        self.assertRejected(lambda d: variable(d, "job").update(multi=False),
                            "`job` must be multi-value")
        self.assertRejected(lambda d: variable(d, "instance").update(includeAll=False),
                            "`instance` must be multi-value and include All")
        self.assertRejected(
            lambda d: variable(d, "instance").update(query="label_values(up, instance)"),
            "variable `instance` queries 'label_values(up, instance)'")
        self.assertRejected(
            lambda d: variable(d, "job").update(datasource={"type": "prometheus", "uid": "P1"}),
            "variable `job` does not use")

    def test_description(self):
        self.assertRejected(lambda d: panel(d, "Compression ratio").pop("description"),
                            "Compression ratio: no description")
        self.assertRejected(lambda d: panel(d, "Checkpoint age").update(description="  "),
                            "Checkpoint age: no description")

    def test_unit(self):
        self.assertRejected(
            lambda d: panel(d, "Server queue depth")["fieldConfig"]["defaults"].pop("unit"),
            "Server queue depth: no unit")
        self.assertRejected(lambda d: panel(d, "Missing workers").pop("fieldConfig"),
                            "Missing workers: no unit")
        self.assertRejected(
            lambda d: panel(d, "Sync latency heatmap")["options"]["yAxis"].pop("unit"),
            "Sync latency heatmap: heatmap without options.yAxis.unit")

    def test_datasource_of_panels_and_queries(self):
        fixed = {"type": "prometheus", "uid": "PBFA97CFB590B2093"}
        self.assertRejected(lambda d: panel(d, "Straggler wait").update(datasource=fixed),
                            "Straggler wait: datasource is not")
        self.assertRejected(
            lambda d: panel(d, "Straggler wait")["targets"][1].update(datasource=fixed),
            "Straggler wait: query B: datasource is not")

    def test_queries_present(self):
        self.assertRejected(lambda d: panel(d, "Failures by reason").update(targets=[]),
                            "Failures by reason: no queries")
        self.assertRejected(lambda d: panel(d, "Failures by reason")["targets"][0].update(expr=""),
                            "Failures by reason: query A: empty expr")

    def test_job_and_instance_filters(self):
        self.assertRejected(
            self.set_expr("Server queue depth", 'job=~"$job", ', ""),
            'selector gradsync_server_queue_depth lacks job=~"$job"')
        self.assertRejected(
            self.set_expr("Server queue depth", 'instance=~"$instance"', 'instance="$instance"'),
            'lacks instance=~"$instance"')
        self.assertRejected(
            self.set_expr("Server queue depth", 'job=~"$job"', 'job=~"gradsync"'),
            'lacks job=~"$job"')

    def test_every_selector_of_a_binary_expression_is_filtered(self):
        # Only the divisor of the compression ratio loses its filters.
        self.assertRejected(
            self.set_expr("Compression ratio",
                          'gradsync_client_wire_bytes_total{job=~"$job", instance=~"$instance", ',
                          "gradsync_client_wire_bytes_total{"),
            "selector gradsync_client_wire_bytes_total lacks job")
        self.assertRejected(
            self.set_expr("Missing workers",
                          'gradsync_scheduler_live_nodes{job=~"$job", instance=~"$instance", ',
                          '{__name__="gradsync_scheduler_live_nodes", ', index=1),
            'selector {...} lacks job=~"$job"')

    def test_bare_metric_without_filters(self):
        self.assertRejected(
            lambda d: panel(d, "Targets up")["targets"][0].update(expr="up"),
            "selector up lacks job")
        self.assertRejected(
            self.set_expr("Checkpoint age", "> 0)",
                          "> 0) and on (instance) gradsync_server_expected_workers"),
            "selector gradsync_server_expected_workers lacks job")

    def test_rate_interval(self):
        self.assertRejected(self.set_expr("Failures by reason", "$__rate_interval", "5m"),
                            "rate() over [5m], not [$__rate_interval]")
        self.assertRejected(
            self.set_expr("Sync latency heatmap", "$__rate_interval", "$__interval"),
            "increase() over [$__interval]")
        self.assertRejected(
            lambda d: panel(d, "CPU usage")["targets"][0].update(
                expr='irate(process_cpu_seconds_total{job=~"$job", instance=~"$instance"}[1m])'),
            "irate() over [1m]")
        self.assertRejected(
            lambda d: panel(d, "CPU usage")["targets"][0].update(
                expr='rate(process_cpu_seconds_total{job=~"$job", instance=~"$instance"})'),
            "rate() without a range")

    def test_unknown_variables(self):
        self.assertRejected(
            self.set_expr("Server queue depth", "gradsync_server_queue_depth{",
                          'gradsync_server_queue_depth{shard=~"$shard", '),
            "query uses $shard")

    def test_unscannable_query(self):
        self.assertRejected(self.set_expr("Server queue depth", "})", "}"),
                            "cannot scan query: unbalanced")

    def test_required_panels(self):
        def drop(d):
            d["panels"] = [p for p in d["panels"] if p.get("title") != "Checkpoint age"]
        self.assertRejected(drop, "required panel 'Checkpoint age' missing")
        self.assertRejected(lambda d: panel(d, "Straggler wait").update(title="Waits"),
                            "required panel 'Straggler wait' missing")

    def test_duplicates(self):
        self.assertRejected(lambda d: panel(d, "Straggler wait").update(id=2),
                            "duplicate panel id 2")
        self.assertRejected(lambda d: panel(d, "Resident memory").update(title="CPU usage"),
                            "duplicate panel title 'CPU usage'")

    def test_panels_in_collapsed_rows_are_checked(self):
        def collapse(d):
            moved = panel(d, "Resident memory")
            d["panels"] = [p for p in d["panels"] if p is not moved]
            row = [p for p in d["panels"] if p["type"] == "row"][-1]
            row["collapsed"] = True
            row["panels"] = [moved]
            moved.pop("description")
        self.assertRejected(collapse, "Resident memory: no description")


class ScannerTest(unittest.TestCase):

    def test_selectors(self):
        selectors, ranges, rangeless = dashboard_lint.selectors_and_ranges(
            'histogram_quantile(0.9, sum by (le, op) (rate(a_bucket{x="1", y=~"b|c"}[5m])))'
            ' / on (op) group_left ignoring (z) max without (le) (b offset 1h30m) > bool 2'
            ' and count(time() - {__name__="c"}) unless inf')
        self.assertEqual(selectors, [
            ("a_bucket", [("x", "=", "1"), ("y", "=~", "b|c")]),
            ("b", []),
            ("", [("__name__", "=", "c")]),
        ])
        self.assertEqual(ranges, [("rate", "5m")])
        self.assertEqual(rangeless, [])

    def test_strings_with_braces_and_escapes(self):
        selectors, _, _ = dashboard_lint.selectors_and_ranges(
            r'label_replace(m{a="}\"{"}, "dst", "$1", "src", "(.*)")')
        self.assertEqual(selectors, [("m", [("a", "=", '}"{')])])

    def test_lint_expr_accepts_a_good_query(self):
        self.assertEqual(dashboard_lint.lint_expr(
            'sum by (reason) (increase(m_total{job=~"$job", instance=~"$instance"}'
            '[$__rate_interval])) / ignoring (reason) group_left'
            ' sum(rate(n_total{instance=~"$instance", job=~"$job", a="b"}[$__rate_interval]))'),
            [])

    def test_lint_expr_needs_a_metric(self):
        self.assertEqual(dashboard_lint.lint_expr("vector(1)"), ["query selects no metric"])

    def test_main_exit_status(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(dashboard_lint.main(["lint", DASHBOARD_PATH]), 0)
        self.assertEqual(out.getvalue(), "")


class PanelQueriesTest(unittest.TestCase):

    def run_main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = panel_queries.main(["panel_queries.py", *args])
        return rc, out.getvalue(), err.getvalue()

    def test_one_line_per_query_with_variables_replaced(self):
        dashboard = load_dashboard()
        expected = [(p["title"], t["expr"]) for p in dashboard_lint.iter_panels(dashboard)
                    if p.get("type") != "row" for t in p["targets"]]
        rc, out, _ = self.run_main(DASHBOARD_PATH)
        self.assertEqual(rc, 0)
        lines = out.splitlines()
        self.assertEqual(len(lines), len(expected))
        for line, (title, expr) in zip(lines, expected):
            got_title, got_expr = line.split("\t")
            self.assertEqual(got_title, title)
            self.assertNotIn("$", got_expr)
            self.assertEqual(got_expr, expr.replace('"$job"', '".*"')
                             .replace('"$instance"', '".*"')
                             .replace("[$__rate_interval]", "[1m]"))

    def test_flags(self):
        rc, out, _ = self.run_main(DASHBOARD_PATH, "--job", "gradsync",
                                   "--instance", "127.0.0.1:9401", "--rate_interval", "30s")
        self.assertEqual(rc, 0)
        first = out.splitlines()[0].split("\t")[1]
        self.assertIn('{job=~"gradsync", instance=~"127.0.0.1:9401"}[30s]', first)

    def test_unknown_variable_fails(self):
        self.assertEqual(panel_queries.substitute("a{b=~\"${job}\"}", {"job": "x"}),
                         'a{b=~"x"}')
        with self.assertRaises(KeyError):
            panel_queries.substitute("a[$__range]", {"job": "x"})


if __name__ == "__main__":
    unittest.main()
