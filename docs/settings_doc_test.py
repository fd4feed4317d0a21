"""docs/settings.md lists exactly the settings the code reads.

The code's settings are found in the sources: every Config getter called
with a literal name (`.GetInt("name", ...)`, the launcher's
`IntFlag(config, "name", ...)`), every `getenv("GRADSYNC_...")`, and in the
PyTorch package every "GRADSYNC_..." literal, `_env_setting("name")` and
`settings.get("name")` (in the PyTorch example only the literals).

Sources under launcher/ give gradsync_launch's flags, under examples/
fmnist_trainer's, the rest (client, cluster, common, wire, scheduler, ps,
server, python) the job settings. A GRADSYNC_ variable that names no setting of any of
these, or that gradsync_launch reads (it takes flags only), is an
environment variable only. Each group must equal the names in the tables of
its section of docs/settings.md.

Usage: settings_doc_test.py (inside Bazel the sources come as runfiles;
outside, run it from the repository root).
"""

import os
import re
import sys

PACKAGES = ("client", "cluster", "common", "wire", "scheduler", "ps", "server",
            "launcher", "examples", "python")
SECTIONS = {
    "launcher": "gradsync_launch",
    "examples": "fmnist_trainer",
}
# gradsync_launch reads flags only: a GRADSYNC_ variable it reads is no flag.
FLAG_ONLY = {"gradsync_launch"}
JOB = "Job settings"
ENV = "Environment variables only"

CPP_SETTING = [
    re.compile(r'(?:\.|->)Get(?:String|Int|Double|Bool)\(\s*"([a-z0-9_]+)"'),
    re.compile(r'\bIntFlag\(\s*\w+,\s*"([a-z0-9_]+)"'),
]
CPP_ENV = re.compile(r'getenv\(\s*"GRADSYNC_([A-Z0-9_]+)"\s*\)')
PY_SETTING = [
    re.compile(r'_env_setting\(\s*"([a-z0-9_]+)"'),
    re.compile(r'\bsettings\.(?:get|setdefault)\(\s*"([a-z0-9_]+)"'),
    re.compile(r'\bsettings\[\s*"([a-z0-9_]+)"\s*\]'),
]
PY_ENV = re.compile(r'"GRADSYNC_([A-Z0-9_]+)"')
ROW = re.compile(r"^\|\s*`([A-Za-z0-9_]+)`\s*\|")


def root():
    base = os.environ.get("TEST_SRCDIR")
    if base:
        return os.path.join(base, os.environ.get("TEST_WORKSPACE", "gradsync"))
    return "."


def sources(top):
    """(package, path) of every non-test source file of PACKAGES."""
    for package in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(top, package)):
            for name in sorted(files):
                if not name.endswith((".cc", ".h", ".py")) or "_test." in name:
                    continue
                yield package, os.path.join(dirpath, name)


def code_settings(top):
    """{section: set of names} as the code reads them."""
    found = {JOB: set(), ENV: set()}
    for section in SECTIONS.values():
        found[section] = set()
    env_vars = []  # (section, NAME) read through the environment
    for package, path in sources(top):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        section = SECTIONS.get(package, JOB)
        python = path.endswith(".py")
        if not (python and package == "examples"):  # the PyTorch example's own flags
            for pattern in PY_SETTING if python else CPP_SETTING:
                found[section].update(pattern.findall(text))
        env_vars += [(section, v) for v in (PY_ENV if python else CPP_ENV).findall(text)]
    settings = set().union(*(v for k, v in found.items() if k not in FLAG_ONLY))
    for section, var in env_vars:
        if section in FLAG_ONLY or var.lower() not in settings:
            found[ENV].add("GRADSYNC_" + var)
    return found


def doc_settings(path):
    """{section: set of names} from the tables under each level-2 heading."""
    found = {}
    section = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                section = line[3:].strip()
                found.setdefault(section, set())
            m = ROW.match(line)
            if m and section is not None:
                found[section].add(m.group(1))
    return found


def main():
    top = root()
    code = code_settings(top)
    doc = doc_settings(os.path.join(top, "docs", "settings.md"))
    problems = []
    if sum(len(v) for v in code.values()) < 50:
        problems.append("found only %d settings in the sources under %s" %
                        (sum(len(v) for v in code.values()), top))
    for section, names in sorted(code.items()):
        documented = doc.get(section)
        if documented is None:
            problems.append("docs/settings.md has no section '## %s'" % section)
            continue
        for name in sorted(names - documented):
            problems.append("%s: '%s' is read by the code but not documented" % (section, name))
        for name in sorted(documented - names):
            problems.append("%s: '%s' is documented but the code does not read it" %
                            (section, name))
        print("%-28s %3d settings" % (section, len(names)))
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
