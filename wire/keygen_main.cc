// gradsync_keygen FILE: writes a new CURVE key pair for a job to FILE (mode
// 0600; an existing file is not overwritten). Give every process of the job
// the file as --key_file or GRADSYNC_KEY_FILE (wire/curve.h).
#include <cstdio>

#include "wire/curve.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  auto key = gradsync::wire::GenerateCurveKey();
  gradsync::Status s = key.ok() ? gradsync::wire::WriteKeyFile(argv[1], *key) : key.status();
  if (!s.ok()) {
    std::fprintf(stderr, "gradsync_keygen: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("wrote a new job key to %s\n", argv[1]);
  return 0;
}
