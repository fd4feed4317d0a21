#!/usr/bin/env bash
# Installs the Debian 12 packages gradsync builds and runs with. Idempotent:
# it asks apt only when a package is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap g++ git
  libzmq3-dev cppzmq-dev
  libflatbuffers-dev flatbuffers-compiler
  prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
  libeigen3-dev zlib1g-dev
  openmpi-bin libopenmpi-dev
  iproute2 slurm-wlm munge
  clang-14 libclang-rt-14-dev
  prometheus python3 python3-torch python3-numpy python3-pytest
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
echo "install_deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
