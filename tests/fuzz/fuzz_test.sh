#!/bin/bash
# Runs a fuzzer for a bounded time (30 s), on a corpus seeded with one valid
# message of every type when a seed writer is given, else from nothing (the
# structure-aware fuzzers build their own messages). Fails if the fuzzer
# reports a crash, a sanitizer error, a leak, a timeout or running out of
# memory (any non-zero exit).
#
# Usage (from the BUILD file): fuzz_test.sh <fuzzer> [<make_seeds> or -]
#     [more libFuzzer flags]
set -euo pipefail

fuzzer="$1"
make_seeds="${2:-}"
shift $(( $# < 2 ? $# : 2 ))
corpus="${TEST_TMPDIR}/corpus"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR}}/"
log="${TEST_TMPDIR}/fuzzer.log"
mkdir -p "${corpus}"

if [[ -n "${make_seeds}" && "${make_seeds}" != "-" ]]; then
  "${make_seeds}" "${corpus}"
  seeds=$(find "${corpus}" -type f | wc -l)
  if [[ "${seeds}" -lt 17 ]]; then
    echo "FAIL: expected a seed for each of the 17 message types, found ${seeds}" >&2
    exit 1
  fi
fi

status=0
"${fuzzer}" -max_total_time=30 -rss_limit_mb=2048 -timeout=5 -print_final_stats=1 \
  -artifact_prefix="${artifacts}" "$@" "${corpus}" >"${log}" 2>&1 || status=$?
tail -n 40 "${log}"
if [[ "${status}" -ne 0 ]]; then
  echo "FAIL: the fuzzer exited with status ${status}; crashing input under ${artifacts}" >&2
  exit 1
fi
if ! grep -q "^Done [0-9]* runs" "${log}"; then
  echo "FAIL: the fuzzer did not finish its run" >&2
  exit 1
fi
echo "PASS: no crash or sanitizer report in $(grep -o '^Done [0-9]* runs' "${log}")"
