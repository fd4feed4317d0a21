// SameHostTransport between two transports of this process (what two
// processes on one host do, through the same shared memory): messages of
// every size arrive whole and in order beside the inner transport's, their
// payloads are released once in the link, a neighbour without a link is
// still heard, a bad frame table ends the link with a clear error before
// anything is allocated (and the transport keeps serving), and /dev/shm is
// left as it was.
#include "wire/same_host_transport.h"

#include <dirent.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "wire/inproc_transport.h"
#include "wire/shm_link.h"

namespace gradsync::wire {
namespace {

constexpr uint64_t kJob = 0x5eed;

// The names under /dev/shm of this job's links.
std::vector<std::string> LinksInDevShm() {
  std::vector<std::string> out;
  const std::string prefix = SameHostTransport::LinkName(kJob, "").substr(1);
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

Message WithPayloads(const std::vector<size_t>& sizes, uint8_t seed,
                     std::shared_ptr<const void> owner = nullptr) {
  Message m;
  m.header = {seed, static_cast<uint8_t>(seed + 1), static_cast<uint8_t>(seed + 2)};
  for (size_t n : sizes) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
    Payload p = Payload::Copy(bytes.data(), n);
    if (owner) p = Payload::Borrow(p.data, p.size, std::make_shared<std::pair<
                                       std::shared_ptr<const void>, std::shared_ptr<const void>>>(
                                       p.owner, owner));
    m.payloads.push_back(p);
  }
  return m;
}

void ExpectSame(const Message& got, const std::vector<size_t>& sizes, uint8_t seed) {
  ASSERT_EQ(got.header, (std::vector<uint8_t>{seed, static_cast<uint8_t>(seed + 1),
                                              static_cast<uint8_t>(seed + 2)}));
  ASSERT_EQ(got.payloads.size(), sizes.size());
  for (size_t f = 0; f < sizes.size(); ++f) {
    ASSERT_EQ(got.payloads[f].size, sizes[f]);
    for (size_t i = 0; i < sizes[f]; ++i) {
      ASSERT_EQ(got.payloads[f].data[i], static_cast<uint8_t>(seed + i * 7)) << "frame " << f;
    }
  }
}

struct Pair {
  InProcNetwork net;
  std::unique_ptr<InProcTransport> a_inner = net.NewTransport("worker-a");
  std::unique_ptr<InProcTransport> b_inner = net.NewTransport("worker-b");
  std::unique_ptr<SameHostTransport> a, b;
  ConnId a_to_b = -1;

  explicit Pair(size_t link_bytes, bool a_uses_shm = true) {
    EXPECT_TRUE(b_inner->Listen("inproc://b").ok());
    SameHostOptions ao;
    ao.job_id = kJob;
    ao.right_endpoint = "inproc://b";
    ao.shm_right = a_uses_shm;
    ao.link_bytes = link_bytes;
    a = std::make_unique<SameHostTransport>(a_inner.get(), ao);
    SameHostOptions bo;
    bo.job_id = kJob;
    bo.left_identity = "worker-a";
    bo.shm_left = true;
    bo.max_frame_bytes = 1 << 20;
    b = std::make_unique<SameHostTransport>(b_inner.get(), bo);
    a_to_b = *a->Connect("inproc://b");
  }
};

TEST(SameHostTransportTest, MessagesOfEverySizeArriveWholeAndInOrderBesideTheInnerOnes) {
  Pair p(4096);  // smaller than most messages: they stream through
  ASSERT_TRUE(p.a->sending_by_shm());
  const std::vector<std::vector<size_t>> shapes = {
      {}, {0}, {100}, {5000}, {100000, 3}, {4096, 4096, 4096}, {1}, {70000}};
  auto owner = std::make_shared<int>(0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    ASSERT_TRUE(p.a->Send(Route::Connection(p.a_to_b),
                          WithPayloads(shapes[i], static_cast<uint8_t>(i), owner),
                          Deadline::AfterMs(1000)).ok());
  }
  // A message through the inner transport from a third peer.
  auto c = p.net.NewTransport("worker-c");
  ConnId c_to_b = *c->Connect("inproc://b");
  ASSERT_TRUE(c->Send(Route::Connection(c_to_b), WithPayloads({10}, 200),
                      Deadline::AfterMs(1000)).ok());
  bool saw_c = false;
  size_t next = 0;
  while (next < shapes.size() || !saw_c) {
    auto in = p.b->Receive(Deadline::AfterMs(5000));
    ASSERT_TRUE(in.ok()) << in.status() << " after " << next << " messages";
    if (in->from.identity == "worker-c") {
      ExpectSame(in->message, {10}, 200);
      saw_c = true;
      continue;
    }
    EXPECT_EQ(in->from.identity, "worker-a");
    ExpectSame(in->message, shapes[next], static_cast<uint8_t>(next));
    ++next;
  }
  EXPECT_TRUE(p.b->receiving_by_shm());
  // Every payload was let go of once its bytes were in the link.
  for (int i = 0; i < 100 && owner.use_count() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(owner.use_count(), 1);
  EXPECT_TRUE(LinksInDevShm().empty()) << "the reader removes the name once it has the link";
}

TEST(SameHostTransportTest, SendsNeverWaitForAReaderThatHasNotReadYet) {
  Pair p(4096);
  // Far more than the link holds, before the reader reads anything.
  for (int i = 0; i < 64; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(p.a->Send(Route::Connection(p.a_to_b), WithPayloads({8192}, 1),
                          Deadline::AfterMs(1000)).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  }
  for (int i = 0; i < 64; ++i) {
    auto in = p.b->Receive(Deadline::AfterMs(5000));
    ASSERT_TRUE(in.ok()) << in.status() << " at " << i;
    ExpectSame(in->message, {8192}, 1);
  }
}

// Payloads lent in place stay intact while the receiver holds a few; past
// half the link they are copied, and once let go of, the link is whole again.
TEST(SameHostTransportTest, HeldPayloadsStayIntactAndTheLinkComesBack) {
  Pair p(4096);
  std::vector<Incoming> held;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(p.a->Send(Route::Connection(p.a_to_b),
                            WithPayloads({700, 300}, static_cast<uint8_t>(round * 3 + i)),
                            Deadline::AfterMs(1000)).ok());
    }
    for (int i = 0; i < 3; ++i) {
      auto in = p.b->Receive(Deadline::AfterMs(5000));
      ASSERT_TRUE(in.ok()) << in.status() << " at " << round << "/" << i;
      held.push_back(std::move(*in));
    }
    for (int i = 0; i < 3; ++i) {
      ExpectSame(held[i].message, {700, 300}, static_cast<uint8_t>(round * 3 + i));
    }
    held.clear();
  }
}

TEST(SameHostTransportTest, ANeighbourWithoutALinkIsHeardThroughTheInnerTransport) {
  Pair p(4096, /*a_uses_shm=*/false);
  EXPECT_FALSE(p.a->sending_by_shm());
  ASSERT_TRUE(p.a->Send(Route::Connection(p.a_to_b), WithPayloads({300}, 9),
                        Deadline::AfterMs(1000)).ok());
  auto in = p.b->Receive(Deadline::AfterMs(3000));
  ASSERT_TRUE(in.ok()) << in.status();
  ExpectSame(in->message, {300}, 9);
  EXPECT_FALSE(p.b->receiving_by_shm());
}

// What a broken or hostile writer could put in the link.
void ExpectBroken(const std::vector<uint8_t>& bytes, const std::string& why) {
  InProcNetwork net;
  auto inner = net.NewTransport("worker-b");
  SameHostOptions o;
  o.job_id = kJob;
  o.left_identity = "forger";
  o.shm_left = true;
  o.max_frame_bytes = 1 << 20;
  SameHostTransport b(inner.get(), o);
  auto link = ShmLink::Create(SameHostTransport::LinkName(kJob, "forger"), 4096);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_EQ((*link)->Write(bytes.data(), bytes.size()), bytes.size());
  auto in = b.Receive(Deadline::AfterMs(3000));
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kDataLoss) << in.status();
  EXPECT_NE(in.status().message().find(why), std::string::npos) << in.status();
  EXPECT_NE(in.status().message().find("forger"), std::string::npos) << in.status();
  // The link is given up (its writer sees it closed) and nothing more is
  // read from it; the transport keeps serving what the network brings.
  EXPECT_TRUE((*link)->PeerClosed());
  ASSERT_TRUE(inner->Listen("inproc://b").ok());
  auto c = net.NewTransport("worker-c");
  ASSERT_TRUE(c->Send(Route::Connection(*c->Connect("inproc://b")), WithPayloads({10}, 5),
                      Deadline::AfterMs(1000)).ok());
  auto next = b.Receive(Deadline::AfterMs(3000));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->from.identity, "worker-c");
  ExpectSame(next->message, {10}, 5);
}

TEST(SameHostTransportTest, ABadFrameTableEndsTheLinkBeforeAnythingIsAllocated) {
  auto table = [](uint32_t magic, uint32_t count, std::vector<uint64_t> sizes) {
    std::vector<uint8_t> out(8 + sizes.size() * 8);
    std::memcpy(out.data(), &magic, 4);
    std::memcpy(out.data() + 4, &count, 4);
    std::memcpy(out.data() + 8, sizes.data(), sizes.size() * 8);
    return out;
  };
  ExpectBroken(table(0xdeadbeef, 1, {4}), "bad frame table");
  ExpectBroken(table(0x47534D31, 0, {}), "bad frame table");
  ExpectBroken(table(0x47534D31, 1000, {}), "bad frame table");
  ExpectBroken(table(0x47534D31, 2, {3, uint64_t{1} << 60}), "above the limit");
  EXPECT_TRUE(LinksInDevShm().empty());
}

TEST(ShmLinkTest, AWriterWhoseReaderNeverCameRemovesItsName) {
  {
    auto link = ShmLink::Create(SameHostTransport::LinkName(kJob, "lonely"), 4096);
    ASSERT_TRUE(link.ok()) << link.status();
    EXPECT_EQ(LinksInDevShm().size(), 1u);
  }
  EXPECT_TRUE(LinksInDevShm().empty());
  EXPECT_EQ(ShmLink::Open(SameHostTransport::LinkName(kJob, "lonely")).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace gradsync::wire
