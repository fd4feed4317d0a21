// Sends to a peer that does not read: they wait in the transport and end
// at their deadline, and retrying them costs work in proportion to the
// sends, not to the sends times the passes of the I/O thread.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "wire/message.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"

namespace gradsync::wire {
namespace {

constexpr int kSends = 3000;

// Posts kSends 256 KiB pushes, each ending by 1.5 s from now, through a
// transport of options `o` to a peer that takes one message and never reads
// again; `outcome` gets each send's status. Returns once all have ended.
void PostToAPeerThatNeverReads(ZmqOptions o, std::unique_ptr<ZmqTransport>* transport,
                               const std::function<void(const Status&)>& outcome) {
  zmq::context_t ctx(1);
  zmq::socket_t sink(ctx, zmq::socket_type::router);
  sink.set(zmq::sockopt::rcvhwm, 1);
  sink.set(zmq::sockopt::rcvbuf, 4096);
  sink.set(zmq::sockopt::linger, 0);
  sink.bind("tcp://127.0.0.1:0");
  const std::string endpoint = sink.get(zmq::sockopt::last_endpoint);
  o.send_hwm = 1;
  o.linger_ms = 0;
  auto t = ZmqTransport::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  *transport = std::move(*t);
  ZmqTransport* keep = transport->get();
  auto conn = keep->Connect(endpoint);
  ASSERT_TRUE(conn.ok()) << conn.status();
  auto block = std::make_shared<std::vector<uint8_t>>(size_t{256} << 10, 7);
  const Payload payload = Payload::Borrow(block->data(), block->size(), block);
  std::atomic<int> done{0};
  const Deadline deadline = Deadline::AfterMs(1500);
  for (int i = 0; i < kSends; ++i) {
    DataFields f;
    f.num_elements = block->size() / 4;
    keep->Post(
        Route::Connection(*conn),
        MakeData({Role::Worker, 0, 1}, MsgType::Push, f, {payload}, 0, static_cast<uint64_t>(i)),
        deadline, [&](const Status& s) {
          outcome(s);
          done.fetch_add(1);
        });
  }
  const Deadline wait = Deadline::AfterMs(120000);
  while (done.load() < kSends && !wait.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(done.load(), kSends);
}

// Seen before: every pass of the I/O thread (one a millisecond while any
// send waits) looked at every send waiting behind the first, so a flood of
// replies to one peer that never reads cost sends x passes.
TEST(ZmqRetryTest, SendsToAPeerThatNeverReadsCostLinearWork) {
  ZmqOptions o;
  o.identity = "flooder";
  o.max_pending_sends_per_peer = kSends;
  std::atomic<int> expired{0};
  std::unique_ptr<ZmqTransport> t;
  PostToAPeerThatNeverReads(o, &t, [&](const Status& s) {
    if (s.code() == StatusCode::kDeadlineExceeded) expired.fetch_add(1);
  });
  ASSERT_NE(t, nullptr);
  // Nearly all of them waited behind the first until their deadline.
  EXPECT_GT(expired.load(), kSends / 2);
  EXPECT_LE(t->retry_steps(), static_cast<uint64_t>(kSends))
      << "retrying cost more than one look at each send";
  t->Shutdown();
}

// A peer that never reads holds at most max_pending_sends_per_peer sends
// waiting: the rest fail at once, so its backlog cannot grow the process.
TEST(ZmqRetryTest, APeerThatNeverReadsHoldsABoundedBacklog) {
  ZmqOptions o;
  o.identity = "answerer";
  o.max_pending_sends_per_peer = 100;
  std::atomic<int> reported{0};  // what /metrics counts (cluster::TransportOptions)
  o.on_send_dropped = [&reported](const std::string&) { reported.fetch_add(1); };
  std::atomic<int> refused{0};
  std::unique_ptr<ZmqTransport> t;
  PostToAPeerThatNeverReads(o, &t, [&](const Status& s) {
    if (s.code() == StatusCode::kUnavailable &&
        s.message().find("it is not reading") != std::string::npos) {
      refused.fetch_add(1);
    }
  });
  ASSERT_NE(t, nullptr);
  // Besides what the connection took, 100 waited; the rest were refused.
  EXPECT_GE(refused.load(), kSends - 100 - 64);
  EXPECT_EQ(t->dropped_sends(), static_cast<uint64_t>(refused.load()));
  EXPECT_EQ(reported.load(), refused.load());
  t->Shutdown();
}

}  // namespace
}  // namespace gradsync::wire
