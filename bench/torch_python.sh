#!/usr/bin/env bash
# bench/NAME.py with the project's venv (tools/venv.sh: torch 2.13.0), or
# the interpreter GRADSYNC_PYTHON names, NAME being the name this script
# runs under (the sh_binary's: torch_compare, elastic_bench), from Bazel's
# runfiles or from a checkout.
set -euo pipefail
name="$(basename "$0" .sh)"
here="$(cd "$(dirname "$0")" && pwd)"
checkout=${BUILD_WORKSPACE_DIRECTORY:-$here/..}
python=${GRADSYNC_PYTHON:-$checkout/.venv/bin/python}
if [ ! -x "$python" ]; then
  echo "$python not found: run tools/venv.sh (or set GRADSYNC_PYTHON)" >&2
  exit 1
fi
if [ -d "$here/$name.runfiles/gradsync" ]; then
  cd "$here/$name.runfiles/gradsync"
else
  cd "$here/.."
fi
exec "$python" "bench/$name.py" "$@"
