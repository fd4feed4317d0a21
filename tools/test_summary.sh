#!/usr/bin/env bash
# Counts the results of a `bazel test` run: every test target of PATTERNS
# (default //...) is passed, failed or skipped.
#
#   tools/test_summary.sh [--config NAME] BAZEL_OUTPUT_LOG [PATTERN...]
#
# With --config (asan, tsan) the log is of `bazel test --config=NAME`: the
# test logs are read from that config's tree and every line names the
# config before the target ("failed: asan //wire:foo (FAILED)").
#
# A target is skipped when it did not run because it needs a GPU (tagged gpu
# and filtered out, or incompatible without --config=cuda), or when it ran
# but printed a line starting with "GRADSYNC-SKIPPED: " (a test whose
# prerequisites are missing here: root for network namespaces, Slurm, a CUDA
# device). Any other target that did not report PASSED counts as failed.
# Prints one line per skipped or failed target, then
# "N passed, N failed, N skipped" alone on the last line. Exit status: 0 when
# nothing failed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly SKIP_MARKER="GRADSYNC-SKIPPED: "
config=()
label=""
if [ "${1:-}" = "--config" ]; then
  config=("--config=$2")
  label="$2 "
  shift 2
fi
log=$1
shift
patterns=("$@")
[ ${#patterns[@]} -gt 0 ] || patterns=(//...)
universe="set(${patterns[*]})"
mapfile -t targets < <(bazel query "tests($universe)" 2>/dev/null | sort)
mapfile -t gpu_targets < <(bazel query "attr(tags, '\\bgpu\\b', tests($universe))" 2>/dev/null)
# Under a sanitizer, tests tagged no_<config> do not run (BUILD says why).
unsanitized=()
if [ -n "$label" ]; then
  mapfile -t unsanitized < <(bazel query \
    "attr(tags, '\\bno_${label% }\\b', tests($universe))" 2>/dev/null)
fi
# The config's own tree: the bazel-testlogs link follows the last command's
# config (after the sanitizer runs, theirs).
testlogs=$(bazel info "${config[@]}" bazel-testlogs 2>/dev/null)

# The status words Bazel printed for target $1 ("PASSED", "FAILED", ...).
status_of() {
  awk -v t="$1" '$1 == t { $1 = ""; print; exit }' "$log" |
    sed -e 's/(cached)//' -e 's/ in [0-9.]*s.*//' -e 's/^ *//'
}

# The reason a test printed after the skip marker, if it did.
skip_reason() {
  local dir="$testlogs/${1#//}"
  dir=${dir/://}
  [ -d "$dir" ] || return 0
  find "$dir" -name test.log -exec grep -h -m 1 "^$SKIP_MARKER" {} + 2>/dev/null |
    head -n 1 | cut -c $((${#SKIP_MARKER} + 1))- || true
}

passed=0 failed=0 skipped=0
for t in "${targets[@]}"; do
  status=$(status_of "$t")
  case "$status" in
    PASSED | FLAKY*)
      reason=$(skip_reason "$t")
      if [ -n "$reason" ]; then
        echo "skipped: $label$t ($reason)"
        skipped=$((skipped + 1))
      else
        passed=$((passed + 1))
      fi
      ;;
    SKIPPED)
      echo "skipped: $label$t (incompatible with this build)"
      skipped=$((skipped + 1))
      ;;
    "")
      if printf '%s\n' "${gpu_targets[@]}" | grep -qxF "$t"; then
        echo "skipped: $label$t (needs a GPU)"
        skipped=$((skipped + 1))
      elif printf '%s\n' "${unsanitized[@]}" | grep -qxF "$t"; then
        echo "skipped: $label$t (not run under this sanitizer)"
        skipped=$((skipped + 1))
      else
        echo "failed: $label$t (did not run)"
        failed=$((failed + 1))
      fi
      ;;
    *)
      echo "failed: $label$t ($status)"
      failed=$((failed + 1))
      ;;
  esac
done
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$failed" -eq 0 ]
