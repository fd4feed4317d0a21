"""Checks the conventions of the gradsync Grafana dashboard.

    python3 dashboards/dashboard_lint.py dashboards/gradsync.json

Prints one line per problem and exits 1 when there is any. The rules:
  - the dashboard has the stable uid and the pinned schemaVersion below, and
    id null (an import creates it rather than overwriting another);
  - variables: `datasource` (type datasource, prometheus), `job` and
    `instance` (query variables, multi-value, with All) over gradsync_build_info;
  - every panel but a row has a description, a unit in
    fieldConfig.defaults.unit (heatmaps also options.yAxis.unit), the
    ${datasource} datasource, and at least one query;
  - every metric selector in a query carries job=~"$job" and
    instance=~"$instance"; every rate(), irate() and increase() takes
    [$__rate_interval]; queries use no other dashboard variable;
  - the panels the dashboard exists for are there (REQUIRED_PANELS).
"""

import json
import re
import sys

EXPECTED_UID = "gradsync-overview"
EXPECTED_SCHEMA_VERSION = 38
DATASOURCE_UID = "${datasource}"
JOB_QUERY = "label_values(gradsync_build_info, job)"
INSTANCE_QUERY = 'label_values(gradsync_build_info{job=~"$job"}, instance)'
QUERY_VARIABLES = {"job", "instance", "__rate_interval"}
RATE_FUNCTIONS = {"rate", "irate", "increase"}
REQUIRED_MATCHERS = (("job", "=~", "$job"), ("instance", "=~", "$instance"))

REQUIRED_PANELS = (
    "Sync latency p50 by op and path",
    "Sync latency p90 by op and path",
    "Sync latency p99 by op and path",
    "Sync latency heatmap",
    "Throughput raw vs wire",
    "Compression ratio",
    "Push staleness distribution",
    "Server round duration",
    "Straggler wait",
    "Missing workers",
    "Server queue depth",
    "Failures by reason",
    "Checkpoint age",
    "Embedding memory per shard",
    "Embedding pulls and pushes",
    "Embedding replication lag",
)

# Words that may stand where a metric name could, but are not one.
_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "atan2", "inf", "nan",
}
# Aggregation operators; `sum by (le) (...)` puts a modifier between the
# operator and its parenthesis.
_AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
    "count_values", "bottomk", "topk", "quantile",
}
# Keywords followed by a parenthesised list of label names.
_LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<variable>\$\{\w+\}|\$\w+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])\d*)*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^=<>@,])
  | (?P<open>[({\[])
  | (?P<close>[)}\]])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    pass


def tokenize(expr):
    """Splits a PromQL expression (with Grafana variables) into tokens.

    Returns a list of (kind, text). Raises PromQLError on a character that
    cannot start a token.
    """
    tokens = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise PromQLError(f"unexpected character {expr[pos]!r} at {pos}")
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
        pos = m.end()
    return tokens


def _unquote(text):
    if text[0] == "`":
        return text[1:-1]
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def _matching(tokens, i, open_text, close_text):
    """Index of the token closing the bracket opened at tokens[i]."""
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j][1] == open_text:
            depth += 1
        elif tokens[j][1] == close_text:
            depth -= 1
            if depth == 0:
                return j
    raise PromQLError(f"unbalanced {open_text!r}")


def _parse_matchers(tokens):
    """[(label, op, value)] from the tokens between { and }."""
    matchers = []
    i = 0
    while i < len(tokens):
        if tokens[i][1] == ",":
            i += 1
            continue
        if (i + 2 >= len(tokens) or tokens[i][0] != "ident" or tokens[i + 1][0] != "op"
                or tokens[i + 2][0] != "string"):
            raise PromQLError("malformed label matchers: " +
                              " ".join(t for _, t in tokens))
        matchers.append((tokens[i][1], tokens[i + 1][1], _unquote(tokens[i + 2][1])))
        i += 3
    return matchers


def selectors_and_ranges(expr):
    """Scans a query.

    Returns (selectors, ranges): selectors is a list of (metric name or "",
    [(label, op, value)]); ranges is a list of (innermost enclosing function
    or None, text inside the brackets). Also returns the rate-like calls that
    have no range. Raises PromQLError on what it cannot scan.
    """
    tokens = tokenize(expr)
    selectors, ranges, rangeless = [], [], []
    stack = []  # [function name or None, saw a range]
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if kind == "ident" and text.lower() in _LABEL_LIST_KEYWORDS and nxt == "(":
            i = _matching(tokens, i + 1, "(", ")") + 1
            continue
        if kind == "ident" and nxt == "(":
            stack.append([text, False])
            i += 2
            continue
        if kind == "ident" and text.lower() in _AGGREGATIONS:
            i += 1
            continue
        if kind == "ident" and text.lower() not in _KEYWORDS:
            if nxt == "{":
                end = _matching(tokens, i + 1, "{", "}")
                selectors.append((text, _parse_matchers(tokens[i + 2:end])))
                i = end + 1
            else:
                selectors.append((text, []))
                i += 1
            continue
        if text == "{":
            end = _matching(tokens, i, "{", "}")
            selectors.append(("", _parse_matchers(tokens[i + 1:end])))
            i = end + 1
            continue
        if text == "[":
            end = _matching(tokens, i, "[", "]")
            function = stack[-1][0] if stack else None
            if stack:
                stack[-1][1] = True
            ranges.append((function, "".join(t for _, t in tokens[i + 1:end])))
            i = end + 1
            continue
        if text == "(":
            stack.append([None, False])
        elif text == ")":
            if not stack:
                raise PromQLError("unbalanced ')'")
            function, saw_range = stack.pop()
            if function in RATE_FUNCTIONS and not saw_range:
                rangeless.append(function)
        elif text in ("}", "]"):
            raise PromQLError(f"unbalanced {text!r}")
        i += 1
    if stack:
        raise PromQLError("unbalanced '('")
    return selectors, ranges, rangeless


def lint_expr(expr):
    """Problems with one panel query, as a list of strings."""
    problems = []
    try:
        selectors, ranges, rangeless = selectors_and_ranges(expr)
    except PromQLError as e:
        return [f"cannot scan query: {e}"]
    if not selectors:
        problems.append("query selects no metric")
    for name, matchers in selectors:
        for label, op, value in REQUIRED_MATCHERS:
            if (label, op, value) not in matchers:
                problems.append(f'selector {name or "{...}"} lacks {label}{op}"{value}"')
    for function, text in ranges:
        if function in RATE_FUNCTIONS and text != "$__rate_interval":
            problems.append(f"{function}() over [{text}], not [$__rate_interval]")
    for function in rangeless:
        problems.append(f"{function}() without a range")
    for var in re.findall(r"\$\{?(\w+)\}?", expr):
        if var not in QUERY_VARIABLES:
            problems.append(f"query uses ${var}; only {sorted(QUERY_VARIABLES)} are set")
    return problems


def iter_panels(dashboard):
    """Every panel, rows' nested panels included, in order."""
    for panel in dashboard.get("panels") or []:
        yield panel
        for nested in panel.get("panels") or []:
            yield nested


def _variable_query(variable):
    query = variable.get("query")
    if isinstance(query, dict):
        query = query.get("query")
    return " ".join(str(query or "").split())


def _uses_datasource_variable(obj):
    ds = obj.get("datasource")
    if isinstance(ds, dict):
        return ds.get("uid") == DATASOURCE_UID
    return ds == DATASOURCE_UID


def lint_variables(dashboard):
    problems = []
    variables = {v.get("name"): v for v in
                 (dashboard.get("templating") or {}).get("list") or []}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("variable `datasource` of type datasource (prometheus) missing")
    for name, query in (("job", JOB_QUERY), ("instance", INSTANCE_QUERY)):
        var = variables.get(name)
        if not var or var.get("type") != "query":
            problems.append(f"query variable `{name}` missing")
            continue
        if _variable_query(var) != query:
            problems.append(f"variable `{name}` queries {_variable_query(var)!r}, not {query!r}")
        if var.get("multi") is not True or var.get("includeAll") is not True:
            problems.append(f"variable `{name}` must be multi-value and include All")
        if not _uses_datasource_variable(var):
            problems.append(f"variable `{name}` does not use the {DATASOURCE_UID} datasource")
    return problems


def lint_panel(panel):
    title = panel.get("title") or f"panel id {panel.get('id')}"
    problems = []
    if not str(panel.get("description") or "").strip():
        problems.append("no description")
    unit = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit")
    if not isinstance(unit, str) or not unit.strip():
        problems.append("no unit (fieldConfig.defaults.unit)")
    if panel.get("type") == "heatmap":
        if not (((panel.get("options") or {}).get("yAxis") or {}).get("unit")):
            problems.append("heatmap without options.yAxis.unit")
    if not _uses_datasource_variable(panel):
        problems.append(f"datasource is not {DATASOURCE_UID}")
    targets = panel.get("targets") or []
    if not targets:
        problems.append("no queries")
    ref_ids = [t.get("refId") for t in targets]
    if len(set(ref_ids)) != len(ref_ids):
        problems.append("duplicate refIds")
    for target in targets:
        ref = target.get("refId")
        if "datasource" in target and not _uses_datasource_variable(target):
            problems.append(f"query {ref}: datasource is not {DATASOURCE_UID}")
        expr = target.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            problems.append(f"query {ref}: empty expr")
            continue
        problems.extend(f"query {ref}: {p}" for p in lint_expr(expr))
    return [f"{title}: {p}" for p in problems]


def lint(dashboard):
    """All problems with a dashboard (a parsed JSON object), as strings."""
    problems = []
    if dashboard.get("uid") != EXPECTED_UID:
        problems.append(f"uid is {dashboard.get('uid')!r}, not {EXPECTED_UID!r}")
    version = dashboard.get("schemaVersion")
    if type(version) is not int or version != EXPECTED_SCHEMA_VERSION:
        problems.append(f"schemaVersion is {version!r}, not {EXPECTED_SCHEMA_VERSION}")
    if dashboard.get("id") is not None:
        problems.append("id must be null")
    problems.extend(lint_variables(dashboard))
    ids, titles = set(), set()
    for panel in iter_panels(dashboard):
        if panel.get("id") in ids:
            problems.append(f"duplicate panel id {panel.get('id')}")
        ids.add(panel.get("id"))
        if panel.get("type") == "row":
            continue
        if panel.get("title") in titles:
            problems.append(f"duplicate panel title {panel.get('title')!r}")
        titles.add(panel.get("title"))
        problems.extend(lint_panel(panel))
    for title in REQUIRED_PANELS:
        if title not in titles:
            problems.append(f"required panel {title!r} missing")
    return problems


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} DASHBOARD.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        dashboard = json.load(f)
    problems = lint(dashboard)
    for p in problems:
        print(f"{argv[1]}: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
