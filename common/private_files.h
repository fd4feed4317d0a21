// Files and directories that only this process's user may touch: job keys,
// checkpoints, journals, logs. Every path is opened without following a
// symbolic link at its last component (O_NOFOLLOW), so another local user
// cannot point one of them at a file of their choice.
//
// Errors name the path, what it is for (`what`, e.g. "key_file") and the
// problem. Thread-safety: pure functions.
#ifndef GRADSYNC_COMMON_PRIVATE_FILES_H_
#define GRADSYNC_COMMON_PRIVATE_FILES_H_

#include <string>

#include "common/status.h"

namespace gradsync {

// Creates `dir` with mode 0700, or takes an existing one that is a
// directory (not a symbolic link to one) owned by this effective user.
// FailedPrecondition otherwise; Unavailable when it cannot be created.
Status MakePrivateDirectory(const std::string& dir, const std::string& what);

// Opens `path` (O_RDONLY | O_NOFOLLOW | O_CLOEXEC) and checks the open file:
// a regular file, owned by this effective user, that group and others may
// neither read nor write. Returns the descriptor (the caller closes it).
// NotFound when it does not exist; InvalidArgument for a symbolic link or a
// file that fails a check.
StatusOr<int> OpenPrivateFile(const std::string& path, const std::string& what);

// Creates `path` for writing, mode 0600, O_NOFOLLOW | O_CLOEXEC plus
// `extra_flags` (e.g. O_EXCL, O_TRUNC, O_APPEND); a file that existed is
// made 0600 too. Returns the descriptor; Unavailable naming the path and
// errno's text when it cannot.
StatusOr<int> CreatePrivateFile(const std::string& path, int extra_flags);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_PRIVATE_FILES_H_
