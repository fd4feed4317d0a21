#!/usr/bin/env bash
# Runs pytest with Debian's interpreter, the one python3-torch is installed
# for (another python3 may come first on PATH). Arguments: test files.
set -euo pipefail
if [ ! -x /usr/bin/python3 ]; then
  echo "/usr/bin/python3 not found (tools/install_deps.sh installs it)" >&2
  exit 1
fi
export PYTHONPATH="$PWD/python:$PWD/tests/torch"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@"
