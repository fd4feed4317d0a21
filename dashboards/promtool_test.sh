#!/usr/bin/env bash
# Runs `promtool ARGS...` (Debian's prometheus package) and fails with it.
set -euo pipefail
if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool not found: install Debian's prometheus package (tools/install_deps.sh)" >&2
  exit 1
fi
promtool --version 2>&1 | sed -n 1p
exec promtool "$@"
