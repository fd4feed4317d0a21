#include "wire/rejected_metrics.h"

namespace gradsync::wire {

RejectedMetrics::RejectedMetrics(prometheus::Registry& registry, const std::string& component) {
  auto& family = prometheus::BuildCounter()
                     .Name("gradsync_messages_rejected_total")
                     .Help("Received messages refused, by component and reason.")
                     .Register(registry);
  for (size_t c = 0; c < by_code_.size(); ++c) {
    by_code_[c] = &family.Add(
        {{"component", component}, {"reason", ErrorCodeLabel(static_cast<ErrorCode>(c))}});
  }
}

size_t RejectedMetrics::Index(ErrorCode code) {
  const auto i = static_cast<size_t>(code);
  return i < static_cast<size_t>(ErrorCode::MAX) + 1 ? i : static_cast<size_t>(ErrorCode::Unknown);
}

void RejectedMetrics::Count(ErrorCode code) { by_code_[Index(code)]->Increment(); }

}  // namespace gradsync::wire
