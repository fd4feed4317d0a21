#include "common/status.h"

namespace gradsync {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kAlreadyExists:
      return "already_exists";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kOutOfRange:
      return "out_of_range";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kInternal:
      return "internal";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kDataLoss:
      return "data_loss";
    case StatusCode::kMembershipChanged:
      return "membership_changed";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithPrefix(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + message_);
}

#define GS_DEFINE_ERROR_(Fn, code) \
  Status Fn(std::string message) { return Status(StatusCode::code, std::move(message)); }
GS_DEFINE_ERROR_(CancelledError, kCancelled)
GS_DEFINE_ERROR_(InvalidArgumentError, kInvalidArgument)
GS_DEFINE_ERROR_(DeadlineExceededError, kDeadlineExceeded)
GS_DEFINE_ERROR_(NotFoundError, kNotFound)
GS_DEFINE_ERROR_(AlreadyExistsError, kAlreadyExists)
GS_DEFINE_ERROR_(FailedPreconditionError, kFailedPrecondition)
GS_DEFINE_ERROR_(AbortedError, kAborted)
GS_DEFINE_ERROR_(OutOfRangeError, kOutOfRange)
GS_DEFINE_ERROR_(UnimplementedError, kUnimplemented)
GS_DEFINE_ERROR_(InternalError, kInternal)
GS_DEFINE_ERROR_(UnavailableError, kUnavailable)
GS_DEFINE_ERROR_(DataLossError, kDataLoss)
GS_DEFINE_ERROR_(MembershipChangedError, kMembershipChanged)
#undef GS_DEFINE_ERROR_

std::ostream& operator<<(std::ostream& os, const Status& status) { return os << status.ToString(); }

}  // namespace gradsync
