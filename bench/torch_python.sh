#!/usr/bin/env bash
# bench/NAME.py with Debian's interpreter (python3-torch), NAME being the
# name this script runs under (the sh_binary's: torch_compare,
# elastic_bench), from Bazel's runfiles or from a checkout.
set -euo pipefail
name="$(basename "$0" .sh)"
here="$(cd "$(dirname "$0")" && pwd)"
if [ -d "$here/$name.runfiles/gradsync" ]; then
  cd "$here/$name.runfiles/gradsync"
else
  cd "$here/.."
fi
exec /usr/bin/python3 "bench/$name.py" "$@"
