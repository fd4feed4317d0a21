#include "common/refusal_log.h"

#include "common/logging.h"

namespace gradsync {

RefusalLog::RefusalLog(const Clock* clock, uint64_t burst, Millis interval, size_t max_keys)
    : clock_(clock != nullptr ? clock : &real_),
      burst_(burst),
      interval_(interval),
      max_keys_(max_keys) {}

bool RefusalLog::Admit(const std::string& peer, const std::string& reason, uint64_t* left_out) {
  const SteadyTime now = clock_->Now();
  std::lock_guard<std::mutex> lock(mu_);
  std::pair<std::string, std::string> key{peer, reason};
  if (entries_.size() >= max_keys_ && entries_.count(key) == 0) key.first = "(other peers)";
  Entry& e = entries_[key];
  ++e.seen;
  if (e.seen > burst_ && now - e.last_line < interval_) {
    ++e.left_out;
    return false;
  }
  *left_out = e.left_out;
  e.left_out = 0;
  e.last_line = now;
  return true;
}

std::string LeftOutNote(uint64_t left_out) {
  if (left_out == 0) return "";
  return " (" + std::to_string(left_out) + " more like it not logged)";
}

std::function<void(const Status&)> LogSendFailure(std::shared_ptr<RefusalLog> log, std::string peer,
                                                  std::string what) {
  return [log = std::move(log), peer = std::move(peer), what = std::move(what)](const Status& s) {
    if (s.ok() || s.code() == StatusCode::kCancelled) return;
    uint64_t left_out = 0;
    if (log->Admit(peer, StatusCodeName(s.code()), &left_out)) {
      GS_LOG(WARNING) << what << " to " << peer << " failed: " << s << LeftOutNote(left_out);
    }
  };
}

}  // namespace gradsync
