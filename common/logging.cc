#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "common/time.h"

namespace gradsync {
namespace {

std::mutex& LogMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

std::string& LogTag() {
  static std::string* tag = new std::string;
  return *tag;
}

std::atomic<LogSeverity> min_severity{LogSeverity::kInfo};

char SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
    case LogSeverity::kFatal:
      return 'F';
  }
  return '?';
}

}  // namespace

void SetLogTag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(LogMutex());
  LogTag() = tag;
}

void SetMinLogSeverity(LogSeverity min) { min_severity.store(min); }

LogMessage::LogMessage(LogSeverity severity, const char* file, int line) : severity_(severity) {
  if (severity_ >= LogSeverity::kError || std::getenv("GRADSYNC_LOG_SOURCE")) {
    stream_ << file << ":" << line << ": ";
  }
}

LogMessage::~LogMessage() {
  if (severity_ < min_severity.load(std::memory_order_relaxed) &&
      severity_ != LogSeverity::kFatal) {
    return;
  }
  double now = WallSeconds();
  std::time_t secs = static_cast<std::time_t>(now);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  int millis = static_cast<int>((now - static_cast<double>(secs)) * 1000);
  {
    std::lock_guard<std::mutex> lock(LogMutex());
    std::fprintf(stderr, "%c %s.%03d %s%s] %s\n", SeverityLetter(severity_), stamp, millis,
                 LogTag().empty() ? "" : LogTag().c_str(), LogTag().empty() ? "gradsync" : "",
                 stream_.str().c_str());
    std::fflush(stderr);
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace gradsync
