#!/usr/bin/env bash
# Makes the project's Python environment: a venv (GRADSYNC_VENV, default
# .venv in the checkout) with torch 2.13.0 (CPU), numpy, pytest and
# expecttest (which torch's own distributed tests import) from pip,
# made with GRADSYNC_VENV_PYTHON (default: the python3 first on PATH).
# Idempotent: a venv whose torch is already 2.13.0 is kept as it is. With
# --gradsync it also pip-installs the gradsync package (python/, built with
# Bazel) into it. Prints one line per phase; pip's own output goes to a log
# (GRADSYNC_VENV_LOG, default $TMPDIR/gradsync_venv.log) whose path and last
# lines are printed on failure. The last line printed is the venv's python.
#
# torch is pinned: an open range would take a CUDA build of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
venv=${GRADSYNC_VENV:-$PWD/.venv}
base=${GRADSYNC_VENV_PYTHON:-python3}
log=${GRADSYNC_VENV_LOG:-${TMPDIR:-/tmp}/gradsync_venv.log}
with_gradsync=0
[ "${1:-}" = "--gradsync" ] && with_gradsync=1
: > "$log"

step() {
  local name=$1 start
  shift
  start=$(date +%s)
  echo "venv: $name ..." >&2
  echo "=== $name: $*" >> "$log"
  if ! "$@" >> "$log" 2>&1; then
    echo "venv: $name failed; the output is in $log; its last lines:" >&2
    tail -n 15 "$log" >&2
    exit 1
  fi
  echo "venv: $name done in $(( $(date +%s) - start )) s" >&2
}

python=$venv/bin/python
have_torch() {
  [ -x "$python" ] && "$python" - "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import sys
import expecttest, numpy, pytest, torch
sys.exit(torch.__version__.split("+")[0] != sys.argv[1])
EOF
}

if have_torch; then
  echo "venv: $venv has torch $TORCH_VERSION" >&2
else
  [ -x "$python" ] || step "creating $venv with $(command -v "$base")" \
      "$base" -m venv "$venv"
  step "installing torch==$TORCH_VERSION (CPU), numpy and pytest" \
      "$python" -m pip install -q --disable-pip-version-check \
      "torch==$TORCH_VERSION" numpy pytest expecttest setuptools wheel
  have_torch || { echo "venv: torch $TORCH_VERSION does not import in $venv" >&2; exit 1; }
fi
if [ "$with_gradsync" = 1 ]; then
  step "installing gradsync from python/ (builds its native parts)" \
      "$python" -m pip install -q --disable-pip-version-check \
      --no-build-isolation --no-deps --force-reinstall ./python
fi
echo "$python"
