// The error convention of gradsync's C APIs (include/gradsync/c_api.h,
// scheduler/scheduler_c_api.h): every gs_ function runs its body through
// CApiGuard, which returns the Status code as an int (the gs_code values are
// the StatusCode values) and records the message that gs_last_error()
// returns. The message is per thread.
#ifndef GRADSYNC_COMMON_C_API_GUARD_H_
#define GRADSYNC_COMMON_C_API_GUARD_H_

#include <exception>
#include <string>

#include "common/status.h"

namespace gradsync {

// Sets the calling thread's last error to "function: message".
void SetCApiError(const char* function, const std::string& message) noexcept;
// Sets it to "".
void ClearCApiError() noexcept;
// The calling thread's last error; valid until its next gs_ call.
const char* LastCApiError() noexcept;

// Runs `body` (returning Status) with every exception caught; returns the
// status code as an int (0 for OK) and records the message of a failure.
template <typename F>
int CApiGuard(const char* function, F&& body) noexcept {
  ClearCApiError();
  try {
    Status s = body();
    if (s.ok()) return static_cast<int>(StatusCode::kOk);
    SetCApiError(function, s.message());
    return static_cast<int>(s.code());
  } catch (const std::exception& e) {
    SetCApiError(function, std::string("internal error: ") + e.what());
  } catch (...) {
    SetCApiError(function, "internal error: unknown exception");
  }
  return static_cast<int>(StatusCode::kInternal);
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_C_API_GUARD_H_
