// Small helpers the benchmarks share: fatal errors, comma lists, the path
// of the running binary, quantiles.
#ifndef GRADSYNC_BENCH_BENCH_UTIL_H_
#define GRADSYNC_BENCH_BENCH_UTIL_H_

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gradsync::bench {

// Prints "<program>: FATAL: <what>" and exits 1 at once.
[[noreturn]] void Die(const std::string& what);

template <typename T>
T OrDie(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().ToString());
  return std::move(v).value();
}

// The non-empty items of `s` between `sep`s.
std::vector<std::string> Split(const std::string& s, char sep = ',');

// The comma-separated positive sizes of `s` ("262144,4194304");
// InvalidArgument naming `s` when one is not a number or is 0.
StatusOr<std::vector<size_t>> ParseSizes(const std::string& s);

// The running executable (/proc/self/exe).
std::string SelfPath();

// Quantile q in [0, 1] of `v` (not empty), interpolating between
// neighbours; 0.5 is the median.
double Quantile(std::vector<double> v, double q);

}  // namespace gradsync::bench

#endif  // GRADSYNC_BENCH_BENCH_UTIL_H_
