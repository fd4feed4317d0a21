// The job's security settings and key file, and the endpoint a node binds:
// loopback is judged by the address a host resolves to, and a node binds
// exactly that address.
#include "wire/curve.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/config.h"
#include "gtest/gtest.h"
#include "wire/transport.h"

namespace gradsync::wire {
namespace {

TEST(CurveLoopbackTest, NamesOfLoopbackRunWithoutCurve) {
  const Config config = Config::FromMap({});
  for (const char* host : {"localhost", "127.0.0.1", "127.3.4.5", "::1"}) {
    auto security = SecurityFromConfig(config, host);
    ASSERT_TRUE(security.ok()) << host << ": " << security.status();
    EXPECT_FALSE(security->has_value()) << host;
  }
}

TEST(CurveLoopbackTest, ANameSpelledLikeLoopbackNeedsCurve) {
  const Config config = Config::FromMap({});
  for (const char* host : {"127.0.0.1.invalid", "localhost.invalid", "0.0.0.0"}) {
    auto security = SecurityFromConfig(config, host);
    ASSERT_FALSE(security.ok()) << host << " started without CURVE";
    EXPECT_NE(security.status().message().find("key_file"), std::string::npos) << security.status();
  }
}

// A key file reached through a link is refused even when the file it
// points at is private: another user could have planted the link.
TEST(CurveKeyFileTest, ALinkToAKeyFileIsRefused) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string real = dir + "/real.key";
  ASSERT_TRUE(WriteKeyFile(real, *GenerateCurveKey()).ok());
  ASSERT_TRUE(ReadKeyFile(real).ok());
  const std::string link = dir + "/link.key";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  auto read = ReadKeyFile(link);
  ASSERT_FALSE(read.ok()) << "a key file was read through a link";
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("key_file " + link + " is a symbolic link"),
            std::string::npos)
      << read.status();
}

TEST(CurveKeyFileTest, AKeyFileOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/theirs.key";
  ASSERT_TRUE(WriteKeyFile(path, *GenerateCurveKey()).ok());
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  auto read = ReadKeyFile(path);
  ASSERT_FALSE(read.ok()) << "another user's key file was taken";
  EXPECT_NE(read.status().message().find("owned by uid 65534"), std::string::npos) << read.status();
}

// A job key: the scheduler's copy serves with the scheduler's pair, the
// members' copy pins its public key and cannot serve, an older file serves
// with the job's pair; a scheduler secret of another pair is refused.
TEST(CurveKeyFileTest, TheSchedulersKeyIsItsOwnAndPinnedByTheMembersCopy) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const CurveKey job = *GenerateJobKey();
  ASSERT_NE(job.scheduler_public_z85, job.public_z85);
  ASSERT_TRUE(WriteKeyFile(dir + "/full.key", job).ok());
  ASSERT_TRUE(WriteKeyFile(dir + "/members.key", MembersCopy(job)).ok());
  auto full = ReadKeyFile(dir + "/full.key");
  auto members = ReadKeyFile(dir + "/members.key");
  ASSERT_TRUE(full.ok() && members.ok());
  EXPECT_EQ(full->scheduler_secret_z85, job.scheduler_secret_z85);
  EXPECT_EQ(members->scheduler_secret_z85, "");
  EXPECT_EQ(SchedulerPublicKey(*members), job.scheduler_public_z85);
  auto serving = SchedulerServerKey(*full);
  ASSERT_TRUE(serving.ok());
  EXPECT_EQ(serving->public_z85, job.scheduler_public_z85);
  EXPECT_EQ(serving->secret_z85, job.scheduler_secret_z85);
  auto refused = SchedulerServerKey(*members);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("members' copy"), std::string::npos);
  const CurveKey older{job.public_z85, job.secret_z85, "", ""};
  EXPECT_EQ(SchedulerPublicKey(older), job.public_z85);
  EXPECT_EQ(SchedulerServerKey(older)->secret_z85, job.secret_z85);
  CurveKey mixed = job;
  mixed.scheduler_secret_z85 = GenerateCurveKey()->secret_z85;
  ASSERT_TRUE(WriteKeyFile(dir + "/mixed.key", mixed).ok());
  auto bad = ReadKeyFile(dir + "/mixed.key");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("is not the secret key"), std::string::npos)
      << bad.status();
}

// A key's secrets are wiped in place (what its destructor and assignments
// do), not only let go: the bytes its strings held are zero (the buffers
// stay the strings'), and the public halves stay.
TEST(CurveKeyTest, ItsSecretsAreWipedInPlace) {
  CurveKey key = *GenerateJobKey();
  ASSERT_EQ(key.secret_z85.size(), 40u);
  ASSERT_EQ(key.scheduler_secret_z85.size(), 40u);
  const char* secret = key.secret_z85.data();
  const char* scheduler = key.scheduler_secret_z85.data();
  const std::string public_z85 = key.public_z85;
  key.Wipe();
  EXPECT_TRUE(key.secret_z85.empty());
  EXPECT_TRUE(key.scheduler_secret_z85.empty());
  EXPECT_EQ(std::string(secret, 40), std::string(40, '\0'));
  EXPECT_EQ(std::string(scheduler, 40), std::string(40, '\0'));
  EXPECT_EQ(key.public_z85, public_z85);
}

// The kernel's flags (VmFlags in /proc/self/smaps) of the mapping that
// holds `address`; "" when none does.
std::string VmFlagsOf(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &begin, &end) == 2 &&
        line.find(':') != std::string::npos && line.find("-") < line.find(' ')) {
      inside = begin <= at && at < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Secret keys live in libsodium's guarded heap: their pages are marked to
// stay out of core dumps (dd), and they stay there when the key is copied
// or read from its file; an ordinary string's are not.
TEST(CurveKeyTest, ItsSecretsAreKeptOutOfCoreDumps) {
  const CurveKey key = *GenerateJobKey();
  const CurveKey copy = key;
  char dir[] = "/tmp/curve_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/job.key";
  ASSERT_TRUE(WriteKeyFile(path, key).ok());
  const CurveKey read = *ReadKeyFile(path);
  ASSERT_EQ(read.secret_z85, key.secret_z85);
  for (const char* secret :
       {key.secret_z85.data(), key.scheduler_secret_z85.data(), copy.secret_z85.data(),
        read.secret_z85.data(), read.scheduler_secret_z85.data()}) {
    const std::string flags = VmFlagsOf(secret);
    ASSERT_FALSE(flags.empty()) << "no mapping holds the secret";
    EXPECT_NE(flags.find(" dd"), std::string::npos) << flags;
  }
  const std::string plain(40, 'x');
  EXPECT_EQ(VmFlagsOf(plain.data()).find(" dd"), std::string::npos) << VmFlagsOf(plain.data());
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(ListenEndpointTest, BindsTheResolvedNumericAddress) {
  EXPECT_EQ(*ListenEndpoint("localhost", 5000), "tcp://127.0.0.1:5000");
  EXPECT_EQ(*ListenEndpoint("127.0.0.7", 0), "tcp://127.0.0.7:0");
  auto unknown = ListenEndpoint("127.0.0.1.invalid", 5000);
  ASSERT_FALSE(unknown.ok()) << *unknown;
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace gradsync::wire
