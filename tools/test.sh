#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, builds
# everything, runs every test (GPU tests only where a GPU is present) and the
# source format check (tools/format.sh, counted as the test "format"), and on
# a machine with nvcc also compiles and links every CUDA target. Then the
# unit tests of the multi-threaded packages run again under AddressSanitizer
# + UBSan and under ThreadSanitizer (SANITIZED below). The last line is
# "N passed, N failed, N skipped" over all three runs (tools/test_summary.sh;
# a sanitizer's lines name it: "failed: tsan //wire:foo (FAILED)"): tests
# that cannot run here (no GPU, not root for network namespaces, no Slurm)
# count as skipped.
#
#   tools/test.sh --fast   the inner loop: the small and medium unit tests
#                          beside the code (not tests/, no sanitizers, no
#                          CUDA build), with the same closing line
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

if [ "${1:-}" = "--fast" ]; then
  echo "test.sh --fast: [1/3] dependencies"
  tools/install_deps.sh
  python=${GRADSYNC_PYTHON:-$(tools/venv.sh)}
  mapfile -t fast < <(bazel query 'attr(size, "small|medium", tests(//...) except tests(//tests/...)) except attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)
  log=$(mktemp "${TMPDIR:-/tmp}/gradsync_test_fast.XXXXXX")
  echo "test.sh --fast: [2/3] ${#fast[@]} small and medium unit tests (bazel's output also in $log)"
  set +e
  bazel test "${fast[@]}" --test_env=GRADSYNC_PYTHON="$python" --test_env=HOME \
    --test_output=errors --show_progress_rate_limit=15 2>&1 | tee "$log"
  set -e
  echo "test.sh --fast: [3/3] results"
  echo "fast tier took $(( $(date +%s) - start )) s"
  rc=0
  tools/test_summary.sh "$log" "${fast[@]}" || rc=1
  [ "$rc" -ne 0 ] || rm -f "$log"
  exit "$rc"
fi

echo "test.sh: [1/5] dependencies"
tools/install_deps.sh
# The project's venv (torch 2.13.0 from pip) runs every torch test;
# GRADSYNC_PYTHON names another interpreter with torch (a GPU machine's).
python=${GRADSYNC_PYTHON:-$(tools/venv.sh)}
format_rc=0
tools/format.sh || format_rc=$?

# With a GPU (and nvcc) the suite builds with --config=cuda and runs the
# gpu-tagged tests too; the torch GPU test looks for a torch with CUDA
# (GRADSYNC_PYTHON first) and fails if it finds none.
# HOME: pip's own settings for the fresh-venv install test.
filters=(--test_tag_filters=-gpu --test_env=GRADSYNC_PYTHON="$python" --test_env=HOME)
# --config=cuda takes nvcc, the CUDA runtime and NCCL from /usr/local/cuda
# (third_party/cuda.BUILD): without one of them the CUDA targets are not
# built, and the summary says which is missing.
cuda=/usr/local/cuda
cuda_missing=""
[ -x $cuda/bin/nvcc ] || cuda_missing="$cuda_missing $cuda/bin/nvcc"
[ -f $cuda/include/nccl.h ] || cuda_missing="$cuda_missing $cuda/include/nccl.h"
ls $cuda/lib64/libnccl.so* >/dev/null 2>&1 || cuda_missing="$cuda_missing $cuda/lib64/libnccl.so"
gpu="no GPU: gpu-tagged tests are skipped"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  if [ -z "$cuda_missing" ]; then
    filters=(--config=cuda --test_env=GRADSYNC_PYTHON="$python" --test_env=HOME)
    gpu="GPU present: --config=cuda, gpu-tagged tests included"
  else
    gpu="GPU present but no${cuda_missing}: gpu-tagged tests are skipped"
  fi
fi
log=$(mktemp "${TMPDIR:-/tmp}/gradsync_test.XXXXXX")
echo "test.sh: [2/5] build and run every test ($gpu; bazel's output also in $log)"
set +e
bazel test //... "${filters[@]}" --test_output=errors --show_progress_rate_limit=15 2>&1 |
  tee "$log"
rc=${PIPESTATUS[0]}
set -e

cuda_rc=0
if [ "${filters[0]}" = "--config=cuda" ]; then
  echo "test.sh: [3/5] every CUDA target was built by the run above"
elif [ -z "$cuda_missing" ]; then
  echo "test.sh: [3/5] nvcc and NCCL found: compiling and linking every CUDA target (--config=cuda)"
  bazel build --config=cuda //... || cuda_rc=$?
else
  echo "test.sh: [3/5] CUDA targets not compiled: no${cuda_missing}"
fi

# The packages whose code runs on several threads, under each sanitizer
# (configs in .bazelrc, each in an output tree of its own). Not run there:
# gpu-tagged tests (CUDA and NCCL are not instrumented), the fuzzers in
# tests/fuzz (built with ASan + UBSan already) and the multi-process tests
# in tests/ (their cost under TSan does not fit CI; the code they run is
# covered here by the packages' own tests). A test that cannot run under
# one sanitizer carries the tag no_asan or no_tsan, with the reason in its
# BUILD file.
SANITIZED=(//client/... //scheduler/... //ps/... //server/... //wire/... //cluster/...)
san_logs=()
echo "test.sh: [4/5] ${SANITIZED[*]} under ASan+UBSan and under TSan"
for config in asan tsan; do
  san_log=$(mktemp "${TMPDIR:-/tmp}/gradsync_test_${config}.XXXXXX")
  san_logs+=("$san_log")
  san_start=$(date +%s)
  set +e
  bazel test --config="$config" "${SANITIZED[@]}" --test_tag_filters="-gpu,-no_$config" \
    --test_output=errors --show_progress_rate_limit=15 2>&1 | tee "$san_log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  set -e
  echo "test.sh: $config took $(( $(date +%s) - san_start )) s"
done

echo "test.sh: [5/5] results"
echo "suite took $(( $(date +%s) - start )) s"
summary_rc=0
total_passed=0 total_failed=0 total_skipped=0
# Runs tools/test_summary.sh with the arguments given, prints its lines but
# the last and adds its counts to the totals.
summarize() {
  local out
  out=$(tools/test_summary.sh "$@") || summary_rc=1
  printf '%s\n' "$out" | sed '$d' | sed '/^$/d'
  read -r p _ f _ s _ <<<"$(printf '%s\n' "$out" | tail -n 1)"
  total_passed=$((total_passed + p))
  total_failed=$((total_failed + f))
  total_skipped=$((total_skipped + s))
}
summarize "$log"
if [ "$format_rc" -eq 0 ]; then
  total_passed=$((total_passed + 1))
elif [ "$format_rc" -eq 2 ]; then
  echo "skipped: format (no clang-format-14 on this machine)"
  total_skipped=$((total_skipped + 1))
else
  echo "failed: format (tools/format.sh lists the files; tools/format.sh --fix formats them)"
  total_failed=$((total_failed + 1))
fi
summarize --config asan "${san_logs[0]}" "${SANITIZED[@]}"
summarize --config tsan "${san_logs[1]}" "${SANITIZED[@]}"
echo "${total_passed} passed, ${total_failed} failed, ${total_skipped} skipped"
[ "$summary_rc" -ne 0 ] || rm -f "$log" "${san_logs[@]}"
[ "$rc" -eq 0 ] && [ "$cuda_rc" -eq 0 ] && [ "$summary_rc" -eq 0 ] &&
  { [ "$format_rc" -eq 0 ] || [ "$format_rc" -eq 2 ]; }
