#include "common/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gradsync {

namespace {

std::string Octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

std::string NotOurs(const std::string& path, const std::string& what, const struct stat& st) {
  return what + " " + path + " is owned by uid " + std::to_string(st.st_uid) +
         ", not by this user (uid " + std::to_string(geteuid()) + ")";
}

}  // namespace

Status MakePrivateDirectory(const std::string& dir, const std::string& what) {
  if (::mkdir(dir.c_str(), 0700) == 0) return OkStatus();
  if (errno != EEXIST) {
    return UnavailableError("cannot create " + what + " " + dir + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    return UnavailableError("cannot inspect " + what + " " + dir + ": " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    return FailedPreconditionError(what + " " + dir +
                                   " is a symbolic link; give the directory "
                                   "itself");
  }
  if (!S_ISDIR(st.st_mode))
    return FailedPreconditionError(what + " " + dir + " is not a directory");
  if (st.st_uid != geteuid()) return FailedPreconditionError(NotOurs(dir, what, st));
  return OkStatus();
}

StatusOr<int> OpenPrivateFile(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return NotFoundError(what + " " + path + " does not exist");
  if (fd < 0 && errno == ELOOP) {
    return InvalidArgumentError(what + " " + path + " is a symbolic link; give the file itself");
  }
  if (fd < 0) {
    return InvalidArgumentError("cannot open " + what + " " + path + ": " + std::strerror(errno));
  }
  struct stat st;
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = "cannot inspect " + what + " " + path + ": " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = what + " " + path + " is not a regular file";
  } else if (st.st_uid != geteuid()) {
    problem = NotOurs(path, what, st);
  } else if ((st.st_mode & 077) != 0) {
    problem = what + " " + path + " may be read or written by others (mode " + Octal(st.st_mode) +
              "): make it its owner's only (chmod 600)";
  }
  if (problem.empty()) return fd;
  ::close(fd);
  return InvalidArgumentError(problem);
}

StatusOr<int> CreatePrivateFile(const std::string& path, int extra_flags) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | extra_flags, 0600);
  if (fd < 0) return UnavailableError("cannot create " + path + ": " + std::strerror(errno));
  if (::fchmod(fd, 0600) != 0) {  // a file that existed keeps its mode otherwise
    const Status s = UnavailableError("cannot make " + path + " private: " + std::strerror(errno));
    ::close(fd);
    return s;
  }
  return fd;
}

}  // namespace gradsync
