#include "common/time.h"

namespace gradsync {

Millis Deadline::Remaining() const {
  if (infinite()) return Millis(24LL * 3600 * 1000);
  auto left = at_ - std::chrono::steady_clock::now();
  if (left <= SteadyTime::duration::zero()) return Millis(0);
  return std::chrono::ceil<Millis>(left);
}

double WallSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace gradsync
