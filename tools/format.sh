#!/usr/bin/env bash
# The C, C++ and CUDA sources in the project's format (.clang-format: Google
# style, 100 columns), checked by clang-format 14. tools/test.sh runs the
# check and counts it as one test ("format"); where clang-format-14 is not
# installed (Debian 13 has none) the check is skipped (exit status 2), as
# another version formats differently.
#
#   tools/format.sh          # check: lists every file that is not formatted
#   tools/format.sh --fix    # rewrites them in place
#
# Files: every *.c, *.cc, *.h, *.cu and *.cuh outside third_party/ that git
# tracks or would track (new files not ignored too; outside a git checkout,
# the same names found under the tree). Exit status: 0 when every file is formatted (or after --fix), 1
# otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly CLANG_FORMAT=clang-format-14
fix=0
[ "${1:-}" = "--fix" ] && fix=1
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "format: skipped: $CLANG_FORMAT is not installed (Debian 13 has no clang-format-14)"
  exit 2
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    '*.c' '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^third_party/')
else
  mapfile -t files < <(find . -path ./third_party -prune -o -path './bazel-*' -prune -o \
    -type f \( -name '*.c' -o -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
    -printf '%P\n' | sort)
fi
if [ "$fix" -eq 1 ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'format: not formatted: %s\n' "${bad[@]}"
  echo "format: ${#bad[@]} of ${#files[@]} files are not formatted (tools/format.sh --fix)"
  exit 1
fi
echo "format: all ${#files[@]} files formatted"
