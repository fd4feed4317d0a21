// SameHostTransport between transports of this process (what processes on
// one host do, through the same shared memory): messages of every size
// arrive whole and in order beside the inner transport's, their payloads
// are released once in the link, several writers reach one reader and it
// answers each, a peer without a link is still heard (either side lacking
// it), a reader that closed or died is written to through the network, a
// bad frame table ends the link with a clear error before anything is
// allocated (and the transport keeps serving), and /dev/shm is left as it
// was.
#include "wire/same_host_transport.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "wire/curve.h"
#include "wire/inproc_transport.h"
#include "wire/node_keys.h"
#include "wire/shm_link.h"
#include "wire/zmq_transport.h"

namespace gradsync::wire {
namespace {

constexpr uint64_t kJob = 0x5eed;

// The names under /dev/shm of this job's links.
std::vector<std::string> LinksInDevShm() {
  std::vector<std::string> out;
  const std::string prefix = SameHostTransport::LinkName(kJob, "", "").substr(1, 26);
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
    if (owner)
      p = Payload::Borrow(
          p.data, p.size,
          std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const void>>>(
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

  // a sends to b (through a link where both want one), b reads.
  explicit Pair(size_t link_bytes, bool a_uses_shm = true, bool b_uses_shm = true) {
    EXPECT_TRUE(b_inner->Listen("inproc://b").ok());
    SameHostOptions bo;
    bo.job_id = kJob;
    bo.peers = {{"worker-a", "", false, b_uses_shm}};
    bo.link_bytes = link_bytes;
    bo.max_frame_bytes = 1 << 20;
    b = std::make_unique<SameHostTransport>(b_inner.get(), bo);
    SameHostOptions ao;
    ao.job_id = kJob;
    ao.peers = {{"worker-b", "inproc://b", a_uses_shm, false}};
    ao.open_wait = Millis(200);
    a = std::make_unique<SameHostTransport>(a_inner.get(), ao);
    a_to_b = *a->Connect("inproc://b");
  }
};

TEST(SameHostTransportTest, MessagesOfEverySizeArriveWholeAndInOrderBesideTheInnerOnes) {
  Pair p(4096);  // smaller than most messages: they stream through
  ASSERT_EQ(p.a->sending_by_shm(), 1u);
  const std::vector<std::vector<size_t>> shapes = {
      {}, {0}, {100}, {5000}, {100000, 3}, {4096, 4096, 4096}, {1}, {70000}};
  auto owner = std::make_shared<int>(0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    ASSERT_TRUE(p.a->Send(Route::Connection(p.a_to_b),
                          WithPayloads(shapes[i], static_cast<uint8_t>(i), owner),
                          Deadline::AfterMs(1000))
                    .ok());
  }
  // A message through the inner transport from a third peer.
  auto c = p.net.NewTransport("worker-c");
  ConnId c_to_b = *c->Connect("inproc://b");
  ASSERT_TRUE(
      c->Send(Route::Connection(c_to_b), WithPayloads({10}, 200), Deadline::AfterMs(1000)).ok());
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
  EXPECT_EQ(p.b->receiving_by_shm(), 1u);
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
    ASSERT_TRUE(
        p.a->Send(Route::Connection(p.a_to_b), WithPayloads({8192}, 1), Deadline::AfterMs(1000))
            .ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  }
  for (int i = 0; i < 64; ++i) {
    auto in = p.b->Receive(Deadline::AfterMs(5000));
    ASSERT_TRUE(in.ok()) << in.status() << " at " << i;
    ExpectSame(in->message, {8192}, 1);
  }
}

// A message that fits the free room but not with the padding that keeps
// its payload from wrapping: its rest follows once the reader makes room,
// in order, before anything sent after it.
TEST(SameHostTransportTest, AMessageThatFitsOnlyWithoutItsPaddingArrivesWhole) {
  Pair p(1 << 16);
  const Route to = Route::Connection(p.a_to_b);
  ASSERT_TRUE(p.a->Send(to, WithPayloads({20000}, 1), Deadline::AfterMs(1000)).ok());
  {
    auto in = p.b->Receive(Deadline::AfterMs(5000));
    ASSERT_TRUE(in.ok()) << in.status();
    ExpectSame(in->message, {20000}, 1);
  }
  // Unread: 20027 bytes of the 65536. The next one's 30027 fit beside
  // them, but its payload starts 40081 bytes in and would wrap: 25455
  // bytes of padding leave room for 20027 of its 30000.
  ASSERT_TRUE(p.a->Send(to, WithPayloads({20000}, 2), Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(p.a->Send(to, WithPayloads({30000}, 3), Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(p.a->Send(to, WithPayloads({100}, 4), Deadline::AfterMs(1000)).ok());
  const std::vector<std::vector<size_t>> sizes = {{20000}, {30000}, {100}};
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto in = p.b->Receive(Deadline::AfterMs(5000));
    ASSERT_TRUE(in.ok()) << in.status() << " at message " << k + 2;
    ExpectSame(in->message, sizes[k], static_cast<uint8_t>(k + 2));
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
                            Deadline::AfterMs(1000))
                      .ok());
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

TEST(SameHostTransportTest, APeerWithoutALinkIsHeardThroughTheInnerTransport) {
  for (bool a_uses_shm : {false, true}) {
    // Either the writer does not use the link the reader made, or the
    // reader made none (the writer gives up after its open_wait).
    Pair p(4096, a_uses_shm, /*b_uses_shm=*/!a_uses_shm);
    EXPECT_EQ(p.a->sending_by_shm(), 0u);
    ASSERT_TRUE(
        p.a->Send(Route::Connection(p.a_to_b), WithPayloads({300}, 9), Deadline::AfterMs(1000))
            .ok());
    auto in = p.b->Receive(Deadline::AfterMs(3000));
    ASSERT_TRUE(in.ok()) << in.status();
    ExpectSame(in->message, {300}, 9);
    EXPECT_EQ(p.b->receiving_by_shm(), 0u);
  }
  EXPECT_TRUE(LinksInDevShm().empty());
}

// What a parameter-server shard does with the workers of its host: three
// writers into one reader, which answers each by its identity; everything
// arrives whole and in order per peer.
TEST(SameHostTransportTest, SeveralWritersReachOneReaderWhichAnswersEach) {
  InProcNetwork net;
  auto shard_inner = net.NewTransport("shard");
  ASSERT_TRUE(shard_inner->Listen("inproc://shard").ok());
  const std::vector<std::string> names = {"w0", "w1", "w2"};
  SameHostOptions so;
  so.job_id = kJob;
  so.link_bytes = 1 << 16;
  for (const std::string& n : names) so.peers.push_back({n, "", true, true});
  SameHostTransport shard(shard_inner.get(), so);
  std::vector<std::unique_ptr<InProcTransport>> inner;
  std::vector<std::unique_ptr<SameHostTransport>> workers;
  std::vector<ConnId> to_shard;
  for (const std::string& n : names) {
    inner.push_back(net.NewTransport(n));
    SameHostOptions wo;
    wo.job_id = kJob;
    wo.link_bytes = 1 << 16;
    wo.peers = {{"shard", "inproc://shard", true, true}};
    workers.push_back(std::make_unique<SameHostTransport>(inner.back().get(), wo));
    to_shard.push_back(*workers.back()->Connect("inproc://shard"));
    EXPECT_EQ(workers.back()->sending_by_shm(), 1u);
  }
  constexpr int kEach = 20;
  for (int i = 0; i < kEach; ++i) {
    for (size_t w = 0; w < names.size(); ++w) {
      ASSERT_TRUE(workers[w]
                      ->Send(Route::Connection(to_shard[w]),
                             WithPayloads({20000 + w}, static_cast<uint8_t>(i)),
                             Deadline::AfterMs(1000))
                      .ok());
    }
  }
  std::vector<int> next(names.size(), 0);
  for (size_t got = 0; got < names.size() * kEach; ++got) {
    auto in = shard.Receive(Deadline::AfterMs(5000));
    ASSERT_TRUE(in.ok()) << in.status() << " after " << got;
    const size_t w = static_cast<size_t>(in->from.identity[1] - '0');
    ASSERT_LT(w, names.size());
    ExpectSame(in->message, {20000 + w}, static_cast<uint8_t>(next[w]++));
    // The answer goes back through the worker's own link.
    ASSERT_TRUE(
        shard.Send(in->from, WithPayloads({100}, static_cast<uint8_t>(w)), Deadline::AfterMs(1000))
            .ok());
  }
  EXPECT_EQ(shard.receiving_by_shm(), names.size());
  EXPECT_EQ(shard.sending_by_shm(), names.size());
  for (size_t w = 0; w < names.size(); ++w) {
    for (int i = 0; i < kEach; ++i) {
      auto in = workers[w]->Receive(Deadline::AfterMs(5000));
      ASSERT_TRUE(in.ok()) << in.status();
      // From the connection to the shard, as the inner transport says.
      EXPECT_EQ(in->from.kind, Route::Kind::kConnection);
      EXPECT_EQ(in->from.conn, to_shard[w]);
      ExpectSame(in->message, {100}, static_cast<uint8_t>(w));
    }
    EXPECT_EQ(workers[w]->receiving_by_shm(), 1u);
  }
  EXPECT_TRUE(LinksInDevShm().empty());
}

// A reader that is gone (its transport shut down) no longer gets messages
// through the link: they go through the network, where its successor, a
// restarted peer under the same identity, hears them.
TEST(SameHostTransportTest, AfterItsReaderIsGoneAPeerIsSentToThroughTheNetwork) {
  Pair p(4096);
  ASSERT_EQ(p.a->sending_by_shm(), 1u);
  ASSERT_TRUE(
      p.a->Send(Route::Connection(p.a_to_b), WithPayloads({50}, 1), Deadline::AfterMs(1000)).ok());
  auto first = p.b->Receive(Deadline::AfterMs(3000));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(p.b->receiving_by_shm(), 1u);
  p.b->Shutdown();
  ASSERT_TRUE(
      p.a->Send(Route::Connection(p.a_to_b), WithPayloads({60}, 2), Deadline::AfterMs(1000)).ok());
  EXPECT_EQ(p.a->sending_by_shm(), 0u);
  auto second = p.b_inner->Receive(Deadline::AfterMs(3000));
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectSame(second->message, {60}, 2);
}

// A peer's lanes (a PS client's ps_lanes) take its link while it is open,
// and each lane's own inner connection (its lane identity) once the link is
// given up: never a second connection under the peer's one identity.
TEST(SameHostTransportTest, APeersLanesTakeItsLinkThenEachItsOwnConnection) {
  Pair p(4096);
  auto lane1 = p.a->ConnectLane("inproc://b", 1);
  auto lane2 = p.a->ConnectLane("inproc://b", 2);
  ASSERT_TRUE(lane1.ok() && lane2.ok());
  EXPECT_NE(*lane1, p.a_to_b);
  EXPECT_NE(*lane1, *lane2);
  uint8_t seed = 0;
  for (ConnId c : {p.a_to_b, *lane1, *lane2}) {
    ASSERT_TRUE(
        p.a->Send(Route::Connection(c), WithPayloads({50}, seed), Deadline::AfterMs(1000)).ok());
    ++seed;
  }
  for (uint8_t i = 0; i < seed; ++i) {
    auto in = p.b->Receive(Deadline::AfterMs(3000));
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(in->from.identity, "worker-a");  // all through the link
    ExpectSame(in->message, {50}, i);
  }
  EXPECT_EQ(p.b_inner->Receive(Deadline::AfterMs(50)).status().code(),
            StatusCode::kDeadlineExceeded)
      << "nothing went over the inner transport";
  p.b->Shutdown();
  for (ConnId c : {*lane1, *lane2}) {
    ASSERT_TRUE(
        p.a->Send(Route::Connection(c), WithPayloads({60}, seed), Deadline::AfterMs(1000)).ok());
    auto in = p.b_inner->Receive(Deadline::AfterMs(3000));
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(in->from.identity, LaneIdentity("worker-a", c == *lane1 ? 1 : 2));
    ExpectSame(in->message, {60}, seed);
    ++seed;
  }
}

// With per-node CURVE keys a message to a peer that is not connected waits
// in the network transport for the connection (until its deadline). A Post
// to a peer whose link reader is gone falls back to the network and must
// stay a Post: it returns at once, and its completion reports the outcome
// later (a ring step posts to its neighbour and goes on polling the job's
// health; waiting in the Post hid a membership change until the deadline).
TEST(SameHostTransportTest, APostToAGoneReaderDoesNotWaitForTheNetwork) {
  const CurveKey job = *GenerateCurveKey(), a_key = *GenerateCurveKey(),
                 b_key = *GenerateCurveKey();
  auto a_keys = std::make_shared<NodeKeys>(job, a_key);
  auto b_keys = std::make_shared<NodeKeys>(job, b_key);
  ZmqOptions ao, bo;
  ao.identity = "worker-a";
  ao.node_keys = a_keys;
  bo.identity = "worker-b";
  bo.node_keys = b_keys;
  auto a_inner = std::move(ZmqTransport::Create(ao)).value();
  auto b_inner = std::move(ZmqTransport::Create(bo)).value();
  const std::string endpoint = *b_inner->Listen("tcp://127.0.0.1:0");
  auto entry = [](const std::string& identity, const CurveKey& key, const std::string& at) {
    NodeInfo n;
    n.identity = identity;
    n.public_key = key.public_z85;
    n.host = "127.0.0.1";
    n.data_port = static_cast<uint16_t>(std::atoi(at.c_str() + at.rfind(':') + 1));
    return n;
  };
  const std::vector<NodeInfo> plan = {entry("worker-a", a_key, "tcp://127.0.0.1:1"),
                                      entry("worker-b", b_key, endpoint)};
  a_keys->SetPlan(plan);
  b_keys->SetPlan(plan);
  SameHostOptions so;
  so.job_id = kJob;
  so.peers = {{"worker-a", "", false, true}};
  auto b = std::make_unique<SameHostTransport>(b_inner.get(), so);
  so.peers = {{"worker-b", endpoint, true, false}};
  so.open_wait = Millis(2000);
  SameHostTransport a(a_inner.get(), so);
  const ConnId to_b = *a.Connect(endpoint);
  ASSERT_EQ(a.sending_by_shm(), 1u);
  ASSERT_TRUE(a.Send(Route::Connection(to_b), WithPayloads({50}, 1), Deadline::AfterMs(5000)).ok());
  ASSERT_TRUE(b->Receive(Deadline::AfterMs(5000)).ok());
  // The peer is gone: its link's reader and its network end.
  b->Shutdown();
  b_inner->Shutdown();
  b.reset();
  b_inner.reset();
  auto finished = std::make_shared<std::promise<Status>>();
  const Deadline deadline = Deadline::AfterMs(30000);
  a.Post(Route::Connection(to_b), WithPayloads({60}, 2), deadline,
         [finished](const Status& s) { finished->set_value(s); });
  EXPECT_FALSE(deadline.Expired()) << "Post waited for the unreachable peer";
  EXPECT_EQ(a.sending_by_shm(), 0u);
  a.Shutdown();
  a_inner->Shutdown();  // ends the send still waiting for its connection
  EXPECT_FALSE(finished->get_future().get().ok());
}

// What a broken or hostile writer could put in the link.
void ExpectBroken(const std::vector<uint8_t>& bytes, const std::string& why) {
  InProcNetwork net;
  auto inner = net.NewTransport("worker-b");
  SameHostOptions o;
  o.job_id = kJob;
  o.peers = {{"forger", "", false, true}};
  o.link_bytes = 4096;
  o.max_frame_bytes = 1 << 20;
  SameHostTransport b(inner.get(), o);
  auto link = ShmLink::Open(SameHostTransport::LinkName(kJob, "forger", "worker-b"));
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
                      Deadline::AfterMs(1000))
                  .ok());
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
    if (!sizes.empty()) std::memcpy(out.data() + 8, sizes.data(), sizes.size() * 8);
    return out;
  };
  ExpectBroken(table(0xdeadbeef, 1, {4}), "bad frame table");
  ExpectBroken(table(0x47534D31, 0, {}), "bad frame table");
  ExpectBroken(table(0x47534D31, 1000, {}), "bad frame table");
  ExpectBroken(table(0x47534D31, 2, {3, uint64_t{1} << 60}), "above the limit");
  EXPECT_TRUE(LinksInDevShm().empty());
}

TEST(ShmLinkTest, AReaderWhoseWriterNeverCameRemovesItsName) {
  const std::string name = SameHostTransport::LinkName(kJob, "never", "lonely");
  {
    auto link = ShmLink::Create(name, 4096);
    ASSERT_TRUE(link.ok()) << link.status();
    EXPECT_EQ(LinksInDevShm().size(), 1u);
  }
  EXPECT_TRUE(LinksInDevShm().empty());
  EXPECT_EQ(ShmLink::Open(name).status().code(), StatusCode::kNotFound);
}

TEST(ShmLinkTest, ALinkTakesOneWriter) {
  const std::string name = SameHostTransport::LinkName(kJob, "first", "reader");
  auto reader = ShmLink::Create(name, 4096);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto writer = ShmLink::Open(name);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE((*reader)->WriterAttached());
  // The name went with the first writer; a stale copy of it is refused too.
  EXPECT_EQ(ShmLink::Open(name).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(LinksInDevShm().empty());
}

// A writer tells a reader that died, however it ended (here SIGKILL, which
// closes nothing), from one that is alive.
TEST(ShmLinkTest, AWriterSeesItsReaderDie) {
  const std::string name = SameHostTransport::LinkName(kJob, "writer", "doomed");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto link = ShmLink::Create(name, 4096);
    const char ok = link.ok() ? 1 : 0;
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    for (;;) pause();
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1);
  auto writer = ShmLink::Open(name);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE((*writer)->ReaderAlive());
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_FALSE((*writer)->ReaderAlive());
  EXPECT_FALSE((*writer)->PeerClosed()) << "a killed reader closes nothing";
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace gradsync::wire
