// gradsync_keygen FILE: writes a new job key to FILE (mode 0600; an
// existing file is not overwritten): the job's CURVE key pair and the
// scheduler's own pair (wire/curve.h). That file is the scheduler's.
// gradsync_keygen --members FILE OUT: writes to OUT the members' copy of
// FILE, without the scheduler's secret key: give it to every other process
// of the job as --key_file or GRADSYNC_KEY_FILE.
#include <cstdio>
#include <cstring>

#include "wire/curve.h"

int main(int argc, char** argv) {
  using gradsync::wire::CurveKey;
  const bool members = argc == 4 && std::strcmp(argv[1], "--members") == 0;
  if (argc != 2 && !members) {
    std::fprintf(stderr, "usage: %s FILE\n       %s --members FILE OUT\n", argv[0], argv[0]);
    return 2;
  }
  gradsync::StatusOr<CurveKey> key =
      members ? gradsync::wire::ReadKeyFile(argv[2]) : gradsync::wire::GenerateJobKey();
  const char* out = members ? argv[3] : argv[1];
  gradsync::Status s = key.status();
  if (s.ok() && members && key->scheduler_secret_z85.empty()) {
    s = gradsync::InvalidArgumentError(std::string(argv[2]) +
                                       " holds no scheduler secret key: it is not a scheduler's "
                                       "job key (make one with gradsync_keygen FILE)");
  }
  if (s.ok()) {
    s = gradsync::wire::WriteKeyFile(out, members ? gradsync::wire::MembersCopy(*key) : *key);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "gradsync_keygen: %s\n", s.message().c_str());
    return 1;
  }
  if (members) {
    std::printf("wrote the members' copy of %s to %s\n", argv[2], out);
  } else {
    std::printf(
        "wrote a new job key to %s (the scheduler's; give the other processes "
        "'gradsync_keygen --members %s OUT')\n",
        out, out);
  }
  return 0;
}
