// The error convention of the C API (client/c_api.h), for C entry points
// defined outside client/c_api.cc: every gs_ function runs its body through
// CApiGuard, which records the message that gs_last_error() returns.
#ifndef GRADSYNC_CLIENT_C_API_GUARD_H_
#define GRADSYNC_CLIENT_C_API_GUARD_H_

#include <exception>
#include <string>

#include "client/c_api.h"
#include "common/status.h"

namespace gradsync::client {

// Sets the calling thread's gs_last_error() to "function: message".
void SetCApiError(const char* function, const std::string& message) noexcept;
// Sets it to "".
void ClearCApiError() noexcept;

// Runs `body` (returning Status) with every exception caught; returns the
// gs_code and records the message of a failure.
template <typename F>
int CApiGuard(const char* function, F&& body) noexcept {
  ClearCApiError();
  try {
    Status s = body();
    if (s.ok()) return GS_OK;
    SetCApiError(function, s.message());
    return static_cast<int>(s.code());
  } catch (const std::exception& e) {
    SetCApiError(function, std::string("internal error: ") + e.what());
  } catch (...) {
    SetCApiError(function, "internal error: unknown exception");
  }
  return GS_INTERNAL;
}

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_C_API_GUARD_H_
