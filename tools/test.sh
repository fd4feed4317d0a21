#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, builds
# everything, runs every test (GPU tests only where a GPU is present), and on
# a machine with nvcc also compiles and links every CUDA target. The last
# line is "N passed, N failed, N skipped" (tools/test_summary.sh): tests that
# cannot run here (no GPU, not root for network namespaces, no Slurm) count
# as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

echo "test.sh: [1/4] dependencies"
tools/install_deps.sh

filters=(--test_tag_filters=-gpu)
gpu="no GPU: gpu-tagged tests are skipped"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  filters=()
  gpu="GPU present"
fi
log=$(mktemp "${TMPDIR:-/tmp}/gradsync_test.XXXXXX")
echo "test.sh: [2/4] build and run every test ($gpu; bazel's output also in $log)"
set +e
bazel test //... "${filters[@]}" --test_output=errors --show_progress_rate_limit=15 2>&1 |
  tee "$log"
rc=${PIPESTATUS[0]}
set -e

cuda_rc=0
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "test.sh: [3/4] nvcc found: compiling and linking every CUDA target (--config=cuda)"
  bazel build --config=cuda //... || cuda_rc=$?
else
  echo "test.sh: [3/4] no nvcc: CUDA targets not compiled"
fi

echo "test.sh: [4/4] results"
echo "suite took $(( $(date +%s) - start )) s"
summary_rc=0
tools/test_summary.sh "$log" || summary_rc=$?
[ "$summary_rc" -ne 0 ] || rm -f "$log"
[ "$rc" -eq 0 ] && [ "$cuda_rc" -eq 0 ] && [ "$summary_rc" -eq 0 ]
