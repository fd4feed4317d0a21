#include "bench/bench_util.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace gradsync::bench {

void Die(const std::string& what) {
  std::fprintf(stderr, "%s: FATAL: %s\n", program_invocation_short_name, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(sep, start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

StatusOr<std::vector<size_t>> ParseSizes(const std::string& s) {
  std::vector<size_t> out;
  for (const std::string& item : Split(s)) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v == 0 || item[0] == '-') {
      return InvalidArgumentError("'" + s + "' is not a list of positive sizes");
    }
    out.push_back(static_cast<size_t>(v));
  }
  return out;
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) Die("cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace gradsync::bench
