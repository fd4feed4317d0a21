// Writes the header fuzzer's seed corpus: one valid message of every type,
// encoded in the fuzzer's input format (fuzz_input.h), one file each.
//
// Usage: make_seeds <directory>   (the directory must exist)
//
// Each seed is decoded again and validated before it is written, so a seed
// that the fuzzer would read differently fails here.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "wire/message.h"
#include "wire/test_util.h"
#include "wire/validate.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <directory>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int written = 0;
  for (gradsync::wire::MsgType type : gradsync::wire::AllMsgTypes()) {
    std::vector<uint8_t> bytes;
    if (!gradsync::fuzz::EncodeFuzzInput(gradsync::wire::SampleMessage(type), &bytes)) {
      std::fprintf(stderr, "cannot encode %s\n", gradsync::wire::MsgTypeName(type));
      return 1;
    }
    gradsync::wire::Message back;
    if (!gradsync::fuzz::DecodeFuzzInput(bytes.data(), bytes.size(), &back) ||
        !gradsync::wire::Validate(back, gradsync::wire::AcceptAllPolicy()).ok()) {
      std::fprintf(stderr, "seed of %s does not decode into a valid message\n",
                   gradsync::wire::MsgTypeName(type));
      return 1;
    }
    const std::string path = dir + "/seed-" + gradsync::wire::MsgTypeName(type);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    ++written;
  }
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
