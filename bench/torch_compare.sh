#!/usr/bin/env bash
# bench/torch_compare.py with Debian's interpreter (python3-torch), from a
# checkout or from Bazel's runfiles.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -f "$here/torch_compare.py" ]; then
  cd "$here/.."
else
  cd "$here/torch_compare.runfiles/gradsync"
fi
exec /usr/bin/python3 bench/torch_compare.py "$@"
