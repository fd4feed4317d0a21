#!/usr/bin/env bash
# Runs `python3 SCRIPT ARGS...`: the Python tests need only the standard library
# of the system python3.
set -euo pipefail
if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 not found (tools/install_deps.sh installs it)" >&2
  exit 1
fi
export PYTHONDONTWRITEBYTECODE=1
exec python3 "$@"
