// Shared-memory links against a hostile local process (tests/shm_attacker):
// a process that makes a link's name first, and a link's other side writing
// head, tail and frame lengths no honest peer writes. The link's owner must
// refuse or give up the link, never copy outside its mapping.
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/subprocess.h"
#include "common/time.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"
#include "wire/inproc_transport.h"
#include "wire/same_host_transport.h"
#include "wire/shm_link.h"

namespace gradsync {
namespace {

using wire::ShmLink;

constexpr size_t kCapacity = 4096;  // the attacker's links
constexpr int64_t kWaitMs = 60000;  // for conditions; a loaded machine is slow

std::string Name(const std::string& what) {
  return "/gradsync-attack-" + std::to_string(getpid()) + "-" + what;
}

Subprocess Attack(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile("tests/shm_attacker")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = Subprocess::Spawn(argv, {}, TmpFile("attacker-" + args[0] + ".log"));
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

void ExpectReady(const Subprocess& attacker) {
  ASSERT_TRUE(attacker.WaitForOutput("ready", Deadline::AfterMs(kWaitMs))) << attacker.Output();
}

std::shared_ptr<ShmLink> OpenWriter(const std::string& name) {
  for (;;) {
    auto link = ShmLink::Open(name);
    if (link.ok()) return *link;
    EXPECT_EQ(link.status().code(), StatusCode::kNotFound) << link.status();
    if (link.status().code() != StatusCode::kNotFound) return nullptr;
  }
}

// Writes 1 MiB at a time until the link breaks; no write may take more than
// the link holds.
void WriteUntilBroken(ShmLink& link) {
  std::vector<uint8_t> data(1 << 20, 0x5A);
  const Deadline deadline = Deadline::AfterMs(kWaitMs);
  while (!link.Broken() && !deadline.Expired()) {
    const size_t n = link.Write(data.data(), data.size());
    ASSERT_LE(n, link.capacity());
    if (n == 0) link.WaitWritable(Deadline::AfterMs(10));
  }
  EXPECT_TRUE(link.Broken());
  EXPECT_TRUE(link.PeerClosed());
  EXPECT_EQ(link.Write(data.data(), data.size()), 0u);
}

void ExpectRefused(const std::string& mode) {
  const std::string name = Name(mode);
  Subprocess attacker = Attack({mode, name});
  ExpectReady(attacker);
  auto link = ShmLink::Open(name);
  EXPECT_EQ(link.status().code(), StatusCode::kFailedPrecondition) << link.status();
  if (link.ok()) WriteUntilBroken(**link);
  shm_unlink(name.c_str());
}

TEST(ShmHostileTest, AWriterRefusesALinkAnotherProcessMadeWithAnotherMode) {
  ExpectRefused("squat");
}

TEST(ShmHostileTest, AWriterRefusesALinkOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "making an object of another uid needs root";
  ExpectRefused("squat-other");
}

// Writes to a link the attacker reads in `mode` until the link breaks;
// returns the writer's position then.
uint64_t WriteToAttacker(const std::string& mode) {
  const std::string name = Name(mode);
  Subprocess attacker = Attack({mode, name});
  ExpectReady(attacker);
  std::shared_ptr<ShmLink> link = OpenWriter(name);
  EXPECT_NE(link, nullptr);
  if (link == nullptr) return 0;
  WriteUntilBroken(*link);
  return link->Position();
}

TEST(ShmHostileTest, AWriterGivesUpALinkWhoseTailRunsAheadOfItsHead) {
  WriteToAttacker("tail-ahead");
}

TEST(ShmHostileTest, AWriterGivesUpALinkWhoseTailFallsBehindByMoreThanItHolds) {
  // The attacker reads honestly through 2 capacities first.
  EXPECT_GE(WriteToAttacker("tail-behind"), 2 * kCapacity);
}

TEST(ShmHostileTest, AReaderGivesUpALinkWhoseHeadRunsAheadOfWhatItHolds) {
  const std::string name = Name("head-ahead");
  auto made = ShmLink::Create(name, kCapacity);
  ASSERT_TRUE(made.ok()) << made.status();
  ShmLink& link = **made;
  Subprocess attacker = Attack({"head-ahead", name});
  ExpectReady(attacker);
  std::vector<uint8_t> out(1 << 20);
  const Deadline deadline = Deadline::AfterMs(kWaitMs);
  while (!link.Broken() && !deadline.Expired()) {
    ASSERT_LE(link.Readable(), link.capacity());
    const size_t n = link.Read(out.data(), out.size());
    ASSERT_LE(n, link.capacity());
    if (n == 0) link.WaitReadable(Deadline::AfterMs(10));
  }
  EXPECT_TRUE(link.Broken());
  EXPECT_EQ(link.Read(out.data(), out.size()), 0u);
}

// A same-host transport reading from the attacker: each of its links is
// given up with DataLoss once, counted, and the transport goes on serving.
class HostileWriterTest : public ::testing::Test {
 protected:
  HostileWriterTest() : inner_(network_.NewTransport("victim")) {
    wire::SameHostOptions o;
    o.job_id = static_cast<uint64_t>(getpid());
    o.link_bytes = kCapacity;
    o.max_message_bytes = 1 << 20;
    o.peers.push_back(wire::SameHostPeer{"attacker", "", false, true});
    o.refusals = refusals_;
    transport_ = std::make_unique<wire::SameHostTransport>(inner_.get(), o);
    name_ = wire::SameHostTransport::LinkName(o.job_id, "attacker", "victim");
  }

  // Receive's outcome once the attacker is in place (not DeadlineExceeded).
  Status ReceiveAfter(Subprocess& attacker) {
    ExpectReady(attacker);
    const Deadline deadline = Deadline::AfterMs(kWaitMs);
    for (;;) {
      auto got = transport_->Receive(Deadline::AfterMs(100));
      if (got.ok()) return InternalError("a message came through");
      if (got.status().code() != StatusCode::kDeadlineExceeded || deadline.Expired()) {
        return got.status();
      }
    }
  }

  void ExpectStillServing() {
    EXPECT_EQ(transport_->links_refused(), 1u);
    EXPECT_EQ(refusals_->dropped.load(), 1u);  // the process's metric
    EXPECT_EQ(transport_->receiving_by_shm(), 0u);
    EXPECT_EQ(transport_->Receive(Deadline::AfterMs(50)).status().code(),
              StatusCode::kDeadlineExceeded);
  }

  std::shared_ptr<wire::TransportRefusals> refusals_ = std::make_shared<wire::TransportRefusals>();
  wire::InProcNetwork network_;
  std::unique_ptr<wire::InProcTransport> inner_;
  std::unique_ptr<wire::SameHostTransport> transport_;
  std::string name_;
};

TEST_F(HostileWriterTest, AMessageAboveTheLimitIsRefusedBeforeItsBytesCome) {
  Subprocess attacker = Attack({"frame", name_, std::to_string(size_t{512} << 20)});
  const Status s = ReceiveAfter(attacker);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("above the limit"), std::string::npos) << s;
  ExpectStillServing();
}

TEST_F(HostileWriterTest, AHeadOutsideTheStreamEndsTheLink) {
  Subprocess attacker = Attack({"head-ahead", name_});
  const Status s = ReceiveAfter(attacker);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("broken"), std::string::npos) << s;
  ExpectStillServing();
}

}  // namespace
}  // namespace gradsync
