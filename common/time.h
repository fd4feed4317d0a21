// Deadlines and clocks. Every blocking call in gradsync takes a Deadline.
//
// Thread-safety: Deadline is a value. Clock implementations are thread-safe.
#ifndef GRADSYNC_COMMON_TIME_H_
#define GRADSYNC_COMMON_TIME_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace gradsync {

using SteadyTime = std::chrono::steady_clock::time_point;
using Millis = std::chrono::milliseconds;

// A point in steady time after which a blocking call gives up.
class Deadline {
 public:
  static Deadline At(SteadyTime at) { return Deadline(at); }
  static Deadline After(std::chrono::nanoseconds d) {
    return Deadline(std::chrono::steady_clock::now() + d);
  }
  static Deadline AfterMs(int64_t ms) { return After(Millis(ms)); }
  static Deadline Infinite() { return Deadline(SteadyTime::max()); }
  static Deadline Past() { return Deadline(SteadyTime::min()); }

  SteadyTime at() const { return at_; }
  bool infinite() const { return at_ == SteadyTime::max(); }
  bool Expired() const { return std::chrono::steady_clock::now() >= at_; }
  // Time left, never negative; capped at one day for infinite deadlines.
  Millis Remaining() const;
  // The earlier of two deadlines.
  Deadline Min(Deadline other) const { return other.at_ < at_ ? other : *this; }

 private:
  explicit Deadline(SteadyTime at) : at_(at) {}
  SteadyTime at_;
};

// Monotonic time source, passed into components so tests can control it.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyTime Now() const = 0;
};

// The process's steady clock. Stateless; one instance may be shared.
class RealClock : public Clock {
 public:
  SteadyTime Now() const override { return std::chrono::steady_clock::now(); }
};

// Seconds since the Unix epoch (wall time), for metrics and logs.
double WallSeconds();

// "1.50 s": a duration for messages.
std::string FormatSeconds(std::chrono::nanoseconds d);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TIME_H_
