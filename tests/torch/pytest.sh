#!/usr/bin/env bash
# Runs pytest with Debian's interpreter, the one python3-torch is installed
# for (another python3 may come first on PATH). Arguments: test files.
# When pytest passes but skipped every test (a GPU test without a CUDA
# device), it prints a line "GRADSYNC-SKIPPED: why", which
# tools/test_summary.sh counts as skipped rather than passed.
set -euo pipefail
if [ ! -x /usr/bin/python3 ]; then
  echo "/usr/bin/python3 not found (tools/install_deps.sh installs it)" >&2
  exit 1
fi
export PYTHONPATH="$PWD/python:$PWD/tests/torch"
export PYTHONDONTWRITEBYTECODE=1
out="${TEST_TMPDIR:-$(mktemp -d)}/pytest.out"
set +e
/usr/bin/python3 -m pytest -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
# pytest's last line: "2 skipped in 0.01s", "3 passed, 1 skipped in 9.10s", ...
last=$(tail -n 1 "$out")
if [ "$rc" -eq 0 ] && grep -qE '[0-9]+ skipped' <<<"$last" && ! grep -qE '[0-9]+ passed' <<<"$last"; then
  reason=$(sed -n 's/^SKIPPED \[[0-9]*\] [^ ]*: //p' "$out" | head -n 1)
  echo "GRADSYNC-SKIPPED: every test was skipped (${reason:-see above})"
fi
exit "$rc"
