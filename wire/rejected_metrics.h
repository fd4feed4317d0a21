// gradsync_messages_rejected_total{component, reason}: received messages a
// component refused, by the ErrorCode it answered with. Every counter is
// resolved at construction, so Count allocates nothing. Several components
// of one process share the family, each with its own `component` label.
//
// Thread-safety: Count is thread-safe.
#ifndef GRADSYNC_WIRE_REJECTED_METRICS_H_
#define GRADSYNC_WIRE_REJECTED_METRICS_H_

#include <array>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "wire/message.h"

namespace gradsync::wire {

class RejectedMetrics {
 public:
  RejectedMetrics(prometheus::Registry& registry, const std::string& component);

  void Count(ErrorCode code);
  prometheus::Counter& counter(ErrorCode code) { return *by_code_[Index(code)]; }

 private:
  static size_t Index(ErrorCode code);
  std::array<prometheus::Counter*, static_cast<size_t>(ErrorCode::MAX) + 1> by_code_{};
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_REJECTED_METRICS_H_
