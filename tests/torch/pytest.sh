#!/usr/bin/env bash
# Runs pytest with the interpreter GRADSYNC_PYTHON names: the project's venv
# (tools/venv.sh, torch 2.13.0), which tools/test.sh passes to every test;
# another python3 may come first on PATH. Arguments: test files.
# When pytest passes but skipped every test (a GPU test without a CUDA
# device), it prints a line "GRADSYNC-SKIPPED: why", which
# tools/test_summary.sh counts as skipped rather than passed.
set -euo pipefail
python=${GRADSYNC_PYTHON:-}
if [ -z "$python" ] || [ ! -x "$python" ]; then
  echo "GRADSYNC_PYTHON ('$python') is not an interpreter: run the tests" \
       "with tools/test.sh, or pass --test_env=GRADSYNC_PYTHON=\$PWD/.venv/bin/python" \
       "(made by tools/venv.sh)" >&2
  exit 1
fi
export PYTHONPATH="$PWD/python:$PWD/tests/torch"
export PYTHONDONTWRITEBYTECODE=1
out="${TEST_TMPDIR:-$(mktemp -d)}/pytest.out"
set +e
"$python" -m pytest -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
# pytest's last line: "2 skipped in 0.01s", "3 passed, 1 skipped in 9.10s", ...
last=$(tail -n 1 "$out")
if [ "$rc" -eq 0 ] && grep -qE '[0-9]+ skipped' <<<"$last" && ! grep -qE '[0-9]+ passed' <<<"$last"; then
  reason=$(sed -n 's/^SKIPPED \[[0-9]*\] [^ ]*: //p' "$out" | head -n 1)
  echo "GRADSYNC-SKIPPED: every test was skipped (${reason:-see above})"
fi
exit "$rc"
