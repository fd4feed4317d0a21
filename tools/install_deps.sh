#!/usr/bin/env bash
# Installs the Debian 12 or 13 packages gradsync builds and runs with
# (torch comes from pip, into the project's venv: tools/venv.sh). Idempotent:
# it asks apt only when a package is missing. It prints one line per phase;
# apt's own output goes to a log file (INSTALL_DEPS_LOG, default
# $TMPDIR/gradsync_install_deps.log), whose path is printed on failure.
set -euo pipefail

# clang for the fuzzers and clang-format for the format check: 14 on Debian
# 12; Debian 13 has no 14, so 19 there (tools/format.sh then skips the check:
# another clang-format formats differently).
debian=$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo 12)
llvm=14
case "$debian" in
  [0-9]*) [ "$debian" -ge 13 ] && llvm=19 ;;
  trixie*|forky*|sid*) llvm=19 ;;
esac

PACKAGES=(
  bazel-bootstrap g++ git
  libzmq3-dev cppzmq-dev libsodium-dev libssl-dev libipsec-mb-dev
  libflatbuffers-dev flatbuffers-compiler
  prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
  libeigen3-dev zlib1g-dev
  openmpi-bin libopenmpi-dev
  iproute2 slurm-wlm munge
  "clang-$llvm" "libclang-rt-$llvm-dev" "clang-format-$llvm"
  prometheus python3 python3-numpy python3-pytest
  python3-venv python3-pip python3-setuptools python3-wheel
  dataset-fashion-mnist
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install_deps: ${#missing[@]} of ${#PACKAGES[@]} packages missing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
log=${INSTALL_DEPS_LOG:-${TMPDIR:-/tmp}/gradsync_install_deps.log}
: > "$log"

# phase NAME COMMAND...: one line of progress; the command's output goes to
# the log, whose path and last lines are printed when it fails.
phase() {
  local name=$1 start
  shift
  start=$(date +%s)
  echo "install_deps: $name ..."
  echo "=== $name: $*" >> "$log"
  if ! "$@" >> "$log" 2>&1; then
    echo "install_deps: $name failed; apt's output is in $log; its last lines:" >&2
    tail -n 15 "$log" >&2
    exit 1
  fi
  echo "install_deps: $name done in $(( $(date +%s) - start )) s"
}

phase "apt-get update" $SUDO apt-get update -q
phase "installing ${#missing[@]} packages" \
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install_deps: all ${#PACKAGES[@]} packages present (apt's output in $log)"
