#include "common/time.h"

#include <cstdio>

namespace gradsync {

Millis Deadline::Remaining() const {
  if (infinite()) return Millis(24LL * 3600 * 1000);
  auto left = at_ - std::chrono::steady_clock::now();
  if (left <= SteadyTime::duration::zero()) return Millis(0);
  return std::chrono::ceil<Millis>(left);
}

std::string FormatSeconds(std::chrono::nanoseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", std::chrono::duration<double>(d).count());
  return buf;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace gradsync
