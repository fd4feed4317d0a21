// Status and StatusOr<T>: how every gradsync library function reports failure.
//
// A Status is either OK or carries a code and a human-readable message that
// names what went wrong (an address, a rank, a field). Library functions never
// throw across their boundary; they return Status / StatusOr<T>.
//
// Thread-safety: values; safe to copy and move between threads.
#ifndef GRADSYNC_COMMON_STATUS_H_
#define GRADSYNC_COMMON_STATUS_H_

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

namespace gradsync {

enum class StatusCode {
  kOk = 0,
  kCancelled,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  // An elastic job's membership changed under the operation: a worker was
  // lost and the survivors start a new epoch (include/gradsync/communicator.h).
  kMembershipChanged,
};

// Stable lower-case name of a code ("deadline_exceeded"), usable as a label.
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "deadline_exceeded: scheduler at 10.0.0.1:5000 did not answer".
  std::string ToString() const;
  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithPrefix(const std::string& prefix) const;
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status CancelledError(std::string message);
Status InvalidArgumentError(std::string message);
Status DeadlineExceededError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status FailedPreconditionError(std::string message);
Status AbortedError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status DataLossError(std::string message);
Status MembershipChangedError(std::string message);

std::ostream& operator<<(std::ostream& os, const Status& status);

// Either a value or a non-OK Status. Accessing value() of an error is a
// programmer error and aborts with the status printed.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT
    if (status_.ok()) Die("StatusOr constructed from an OK Status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& {
    Check();
    return *value_;
  }
  T& value() & {
    Check();
    return *value_;
  }
  T&& value() && {
    Check();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void Check() const {
    if (!status_.ok()) Die("StatusOr::value() on error: " + status_.ToString());
  }
  [[noreturn]] static void Die(const std::string& what) {
    std::cerr << what << std::endl;
    std::abort();
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace gradsync

// Returns from the enclosing function if `expr` yields a non-OK Status.
#define GS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::gradsync::Status gs_status_ = (expr);  \
    if (!gs_status_.ok()) return gs_status_; \
  } while (0)

#define GS_CONCAT_INNER_(a, b) a##b
#define GS_CONCAT_(a, b) GS_CONCAT_INNER_(a, b)
#define GS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// `GS_ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a StatusOr or returns its
// error from the enclosing function.
#define GS_ASSIGN_OR_RETURN(lhs, expr) \
  GS_ASSIGN_OR_RETURN_IMPL_(GS_CONCAT_(gs_statusor_, __LINE__), lhs, expr)

#endif  // GRADSYNC_COMMON_STATUS_H_
