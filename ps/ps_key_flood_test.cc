// A shard on real ZeroMQ sockets against a job member that floods it with
// keys outside the job's plan: every such message is refused and counted,
// no key is left behind for them, and the job's own keys still serve.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/ps_shard.h"
#include "wire/zmq_transport.h"

namespace gradsync::server {
namespace {

using wire::MsgType;

constexpr uint64_t kJob = 91;
constexpr int kPlanKeys = 8;
constexpr int kForged = 3000;

std::unique_ptr<wire::ZmqTransport> NewTransport(const std::string& identity) {
  wire::ZmqOptions o;
  o.identity = identity;
  auto t = wire::ZmqTransport::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

wire::Message Data(int worker, MsgType type, uint32_t bucket, uint64_t round,
                   const std::vector<float>& values) {
  wire::DataFields f;
  f.bucket = bucket;
  f.num_elements = values.size();
  f.round = round;
  std::vector<wire::Payload> payloads;
  if (type == MsgType::Push) {
    payloads.push_back(wire::Payload::Copy(values.data(), values.size() * sizeof(float)));
  }
  return wire::MakeData({wire::Role::Worker, worker, kJob}, type, f, std::move(payloads), round,
                        round);
}

class KeyFlood : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = NewTransport("shard");
    auto bound = server_->Listen("tcp://127.0.0.1:0");
    ASSERT_TRUE(bound.ok()) << bound.status();
    PsShardOptions o;
    o.rules.num_workers = 2;
    o.rules.max_keys = kPlanKeys;  // the plan: kPlanKeys partitions
    o.threads = 1;
    for (int w = 0; w < 2; ++w) {
      const std::string id = "worker" + std::to_string(w);
      o.rules.worker_identities.push_back(id);
      workers_.push_back(NewTransport(id));
      auto conn = workers_.back()->Connect(*bound);
      ASSERT_TRUE(conn.ok()) << conn.status();
      conns_.push_back(*conn);
    }
    auto shard = PsShard::Start(server_.get(), o, {wire::Role::Server, 0, kJob});
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
  }
  void TearDown() override {
    if (shard_) shard_->Shutdown();
  }

  void Send(int w, wire::Message m) {
    ASSERT_TRUE(
        workers_[w]
            ->Send(wire::Route::Connection(conns_[w]), std::move(m), Deadline::AfterMs(10000))
            .ok());
  }
  // The next message worker w gets that is not an Ack.
  wire::Message Next(int w) {
    for (;;) {
      auto in = workers_[w]->Receive(Deadline::AfterMs(20000));
      EXPECT_TRUE(in.ok()) << in.status();
      if (!in.ok()) return {};
      if (in->message.header_view()->type() != MsgType::Ack) return std::move(in->message);
    }
  }

  std::unique_ptr<wire::ZmqTransport> server_;
  std::vector<std::unique_ptr<wire::ZmqTransport>> workers_;
  std::vector<wire::ConnId> conns_;
  std::unique_ptr<PsShard> shard_;

  // The next message worker w gets, Acks included.
  wire::Message NextAny(int w) {
    auto in = workers_[w]->Receive(Deadline::AfterMs(20000));
    EXPECT_TRUE(in.ok()) << in.status();
    return in.ok() ? std::move(in->message) : wire::Message{};
  }
};

// Seen before: every refused push and every pull of an unknown key left an
// empty key behind, so a member's flood used up ps_max_keys and the job's
// own keys were refused as Oversized; then a member's plausible pushes of
// keys worker 0 never pushed were taken, each a key of its own, until the
// shard held ps_max_keys of them.
TEST_F(KeyFlood, KeysOutsideThePlanAreRefusedAndLeaveNoKeyBehind) {
  const std::vector<float> grad = {1, 2, 3, 4};
  for (int i = 0; i < kForged; ++i) {
    const uint32_t bucket = 1000 + static_cast<uint32_t>(i);
    // A pull of a key nobody pushed; a push of round 1 (plausible) or far
    // ahead of its round.
    const MsgType type = i % 2 == 0 ? MsgType::Pull : MsgType::Push;
    Send(1, Data(1, type, bucket, i % 4 == 3 ? 9 : 1, grad));
  }
  for (int i = 0; i < kForged; ++i) {
    wire::Message m = NextAny(1);
    ASSERT_EQ(m.header_view()->type(), MsgType::Error) << "forged message " << i;
    EXPECT_EQ(m.header_view()->body_as_ErrorBody()->code(), wire::ErrorCode::Busy);
  }
  EXPECT_EQ(shard_->stats().unplanned, static_cast<uint64_t>(kForged / 2));  // the pushes
  EXPECT_EQ(shard_->stats().early_pulls, static_cast<uint64_t>(kForged / 2));
  EXPECT_EQ(shard_->stats().rejected, 0u);
  auto keys = shard_->Keys();
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 0u) << "forged keys were kept";

  // The plan's keys (those worker 0 pushes), every one of the bound, still
  // serve both workers.
  for (uint32_t b = 0; b < kPlanKeys; ++b) {
    Send(0, Data(0, MsgType::Push, b, 1, {0, 2, 4, 8}));
    ASSERT_EQ(NextAny(0).header_view()->type(), MsgType::Ack) << "key " << b;
    Send(0, Data(0, MsgType::Pull, b, 1, grad));
  }
  for (uint32_t b = 0; b < kPlanKeys; ++b) {
    Send(1, Data(1, MsgType::Push, b, 1, {1, 2, 4, 8}));
    Send(1, Data(1, MsgType::Pull, b, 1, grad));
  }
  for (int w = 0; w < 2; ++w) {
    for (int b = 0; b < kPlanKeys; ++b) {
      wire::Message m = Next(w);
      ASSERT_EQ(m.header_view()->type(), MsgType::Reply) << "key " << b << " worker " << w;
      std::vector<float> got(4);
      std::memcpy(got.data(), m.payloads.at(0).data, sizeof(float) * 4);
      EXPECT_EQ(got, (std::vector<float>{0.5f, 2, 4, 8}));
    }
  }
  EXPECT_EQ(shard_->Keys()->size(), static_cast<size_t>(kPlanKeys));
  // Past the plan's bound a new key of worker 0's is refused, and keeps
  // nothing either.
  Send(0, Data(0, MsgType::Push, 5000, 1, grad));
  wire::Message over = Next(0);
  EXPECT_EQ(over.header_view()->type(), MsgType::Error);
  EXPECT_EQ(over.header_view()->body_as_ErrorBody()->code(), wire::ErrorCode::Oversized);
  EXPECT_EQ(shard_->Keys()->size(), static_cast<size_t>(kPlanKeys));
}

}  // namespace
}  // namespace gradsync::server
