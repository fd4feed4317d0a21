"""Every panel query, with the variables replaced, is PromQL that promtool parses."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DASHBOARD = os.path.join(HERE, "gradsync.json")
PANEL_QUERIES = os.path.join(HERE, "panel_queries.py")


def check_rules(exprs):
    """Runs `promtool check rules` on one recording rule per expr."""
    lines = ["groups:", "  - name: panel_queries", "    rules:"]
    for i, expr in enumerate(exprs):
        lines.append(f"      - record: panel_query_{i}")
        lines.append(f"        expr: {json.dumps(expr)}")
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False,
                                     dir=os.environ.get("TEST_TMPDIR")) as f:
        f.write("\n".join(lines) + "\n")
    try:
        return subprocess.run(["promtool", "check", "rules", f.name],
                              capture_output=True, text=True)
    finally:
        os.unlink(f.name)


class PanelQueriesPromQLTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if shutil.which("promtool") is None:
            raise AssertionError("promtool not found: install Debian's prometheus package "
                                 "(tools/install_deps.sh)")

    def test_every_panel_query_parses(self):
        out = subprocess.run([sys.executable, PANEL_QUERIES, DASHBOARD],
                             capture_output=True, text=True, check=True).stdout
        rows = [line.split("\t") for line in out.splitlines()]
        self.assertGreater(len(rows), 20)
        for row in rows:
            self.assertEqual(len(row), 2, row)
        result = check_rules([expr for _, expr in rows])
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn(f"SUCCESS: {len(rows)} rules found", result.stdout)

    def test_promtool_rejects_a_broken_query(self):
        result = check_rules(['sum by (le) (rate(m_bucket{job=~".*"}[1m])'])
        self.assertNotEqual(result.returncode, 0)


if __name__ == "__main__":
    unittest.main()
