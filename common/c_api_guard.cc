#include "common/c_api_guard.h"

namespace gradsync {
namespace {

thread_local std::string last_error;

}  // namespace

void SetCApiError(const char* function, const std::string& message) noexcept {
  try {
    last_error = std::string(function) + ": " + message;
  } catch (...) {
    last_error.clear();
  }
}

void ClearCApiError() noexcept { last_error.clear(); }

const char* LastCApiError() noexcept { return last_error.c_str(); }

}  // namespace gradsync
