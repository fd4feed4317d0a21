// Text helpers of the Scheduler's files (scheduler.cc, scheduler_assembly.cc).
#ifndef GRADSYNC_SCHEDULER_SCHEDULER_TEXT_H_
#define GRADSYNC_SCHEDULER_SCHEDULER_TEXT_H_

#include <string>
#include <vector>

#include "flatbuffers/flatbuffers.h"
#include "wire/message.h"

namespace gradsync::server {

inline std::string Join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// Text a node supplied (hosts, error messages, reasons, reachability
// details), fit for a log line: non-printables as \xNN, cut at 256 bytes.
inline std::string PeerText(const std::string& text) { return wire::Escaped(text, 256); }
inline std::string PeerText(const flatbuffers::String* text) { return wire::Escaped(text, 256); }

}  // namespace gradsync::server

#endif  // GRADSYNC_SCHEDULER_SCHEDULER_TEXT_H_
