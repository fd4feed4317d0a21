#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, builds
# everything, runs every test (GPU tests only where a GPU is present), and on
# a machine with nvcc also compiles and links every CUDA target.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh

start=$(date +%s)
filters=(--test_tag_filters=-gpu)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  filters=()
fi
log=$(mktemp)
set +e
bazel test //... "${filters[@]}" --test_output=errors 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

cuda_rc=0
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== nvcc found: compiling and linking every CUDA target (--config=cuda)"
  bazel build --config=cuda //... || cuda_rc=$?
fi

passed=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$log" || true)
failed=$(grep -cE "^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS)" "$log" || true)
rm -f "$log"
echo "suite took $(( $(date +%s) - start )) s"
echo "${passed} passed, ${failed} failed"
[ "$rc" -eq 0 ] && [ "$cuda_rc" -eq 0 ]
