// Rate limit for log lines about input refused from peers, so that a peer
// sending garbage cannot flood the log: per (peer, reason), the first
// `burst` refusals are logged, then at most one line per `interval`, which
// says how many were left out since the last line.
//
// At most `max_keys` (peer, reason) pairs are tracked; past that, further
// peers share one entry per reason, so the limiter's memory is bounded
// whatever identities peers choose.
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_COMMON_REFUSAL_LOG_H_
#define GRADSYNC_COMMON_REFUSAL_LOG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/status.h"
#include "common/time.h"

namespace gradsync {

class RefusalLog {
 public:
  // `clock` must outlive this; null: the process's steady clock.
  explicit RefusalLog(const Clock* clock = nullptr, uint64_t burst = 3,
                      Millis interval = Millis(10000), size_t max_keys = 1024);

  // Whether a line about one more refusal of `reason` from `peer` is to be
  // written now; when it is, *left_out is how many refusals of that pair
  // went unlogged since its previous line.
  bool Admit(const std::string& peer, const std::string& reason, uint64_t* left_out);

 private:
  struct Entry {
    uint64_t seen = 0;
    uint64_t left_out = 0;
    SteadyTime last_line{};
  };

  const RealClock real_;
  const Clock* const clock_;
  const uint64_t burst_;
  const Millis interval_;
  const size_t max_keys_;
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Entry> entries_;  // guarded by mu_
};

// "" for 0; otherwise " (N more like it not logged)", to end a line.
std::string LeftOutNote(uint64_t left_out);

// A callback for Transport::Post that logs, through `log` (rate-limited per
// peer and status code), that `what` could not be sent to `peer`. A
// cancelled send (the transport shut down) is not logged. The callback
// keeps `log` alive: it may run after its poster is gone.
std::function<void(const Status&)> LogSendFailure(std::shared_ptr<RefusalLog> log, std::string peer,
                                                  std::string what);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_REFUSAL_LOG_H_
