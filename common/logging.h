// Line-oriented logging to stderr: `GS_LOG(INFO) << "joined as worker 3";`
//
// Each line carries a severity letter, wall time and the process tag set by
// SetLogTag ("scheduler", "server 1", "worker 3"). Lines from different
// threads never interleave. GS_CHECK aborts: only for programmer errors, never
// for anything a peer sent.
#ifndef GRADSYNC_COMMON_LOGGING_H_
#define GRADSYNC_COMMON_LOGGING_H_

#include <sstream>
#include <string>

namespace gradsync {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// Sets the tag printed on every line of this process. Call before threads start.
void SetLogTag(const std::string& tag);
// Lines below `min` are dropped from then on (a tool whose own output is a
// table sets kWarning); kInfo, every line, by default.
void SetMinLogSeverity(LogSeverity min);

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

}  // namespace gradsync

#define GS_LOG_SEVERITY_INFO ::gradsync::LogSeverity::kInfo
#define GS_LOG_SEVERITY_WARNING ::gradsync::LogSeverity::kWarning
#define GS_LOG_SEVERITY_ERROR ::gradsync::LogSeverity::kError
#define GS_LOG_SEVERITY_FATAL ::gradsync::LogSeverity::kFatal
#define GS_LOG(sev) ::gradsync::LogMessage(GS_LOG_SEVERITY_##sev, __FILE__, __LINE__).stream()
#define GS_CHECK(cond) \
  if (!(cond)) GS_LOG(FATAL) << "check failed: " #cond " "

#endif  // GRADSYNC_COMMON_LOGGING_H_
