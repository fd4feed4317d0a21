#include "client/link_probe.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "wire/curve.h"
#include "wire/node_keys.h"

namespace gradsync::client {
namespace {

// Two hosts' first workers of a CURVE job and a third member ("m"): each
// with its node key and the same plan.
struct Job {
  Job() {
    job = *wire::GenerateCurveKey();
    for (const char* name : {"a", "b", "m"}) pairs[name] = *wire::GenerateCurveKey();
  }
  std::shared_ptr<wire::NodeKeys> KeysOf(const std::string& name) {
    auto keys = std::make_shared<wire::NodeKeys>(job, pairs[name]);
    std::vector<wire::NodeInfo> plan;
    for (const auto& [who, pair] : pairs) {
      wire::NodeInfo n;
      n.role = wire::Role::Worker;
      n.identity = who;
      n.host = "127.0.0.1";
      n.data_port = static_cast<uint16_t>(1 + plan.size());
      n.public_key = pair.public_z85;
      plan.push_back(n);
    }
    keys->SetPlan(plan);
    return keys;
  }
  wire::CurveKey job;
  std::map<std::string, wire::CurveKey> pairs;
};

wire::TcpStreamOptions Options(const std::string& identity, std::vector<std::string> accept,
                               std::shared_ptr<const wire::NodeKeys> keys) {
  wire::TcpStreamOptions o;
  o.job_id = 7;
  o.identity = identity;
  o.accept = std::move(accept);
  o.max_frame_bytes = size_t{1} << 20;
  o.max_message_bytes = o.max_frame_bytes + (64 << 10);
  o.node_keys = std::move(keys);
  o.refusals = std::make_shared<wire::TransportRefusals>();
  return o;
}

// a's echo, taking b's probes only, and where it listens.
struct Echo {
  explicit Echo(Job& job)
      : echo(LinkEcho::Listen(
            Options(wire::ProbeIdentity("a"), {wire::ProbeIdentity("b")}, job.KeysOf("a")),
            "tcp://127.0.0.1:0")),
        endpoint(echo.ok() ? "tcp://127.0.0.1:" + std::to_string((*echo)->port()) : "") {}
  StatusOr<std::unique_ptr<LinkEcho>> echo;
  std::string endpoint;
};

TEST(LinkProbeTest, APlanMemberTimesItsLinkOverASealedStream) {
  Job job;
  Echo a(job);
  ASSERT_TRUE(a.echo.ok()) << a.echo.status();
  EXPECT_TRUE((*a.echo)->sealed());
  const std::string& endpoint = a.endpoint;
  auto keys = job.KeysOf("b");
  keys->AddEndpoint("a", endpoint);
  auto timing = TimeLink(Options(wire::ProbeIdentity("b"), {}, keys), endpoint, size_t{512} << 10,
                         Deadline::AfterMs(20000));
  ASSERT_TRUE(timing.ok()) << timing.status();
  EXPECT_GT(timing->empty.count(), 0);
  EXPECT_GE(timing->full.count(), timing->empty.count() / 4);  // the same link, more bytes
}

// A member the echo was not told of (not a host's first worker) and a
// stranger to the job get no answer: their connections are refused.
TEST(LinkProbeTest, OnlyTheProbersTheEchoTakesAreAnswered) {
  Job job;
  Echo a(job);
  ASSERT_TRUE(a.echo.ok()) << a.echo.status();
  const std::string& endpoint = a.endpoint;
  auto member = job.KeysOf("m");
  member->AddEndpoint("a", endpoint);
  auto refused = TimeLink(Options(wire::ProbeIdentity("m"), {}, member), endpoint, 1024,
                          Deadline::AfterMs(3000));
  EXPECT_FALSE(refused.ok());
  // Under b's name with m's key: the handshake fails (the plan binds b's).
  auto posing = TimeLink(Options(wire::ProbeIdentity("b"), {}, member), endpoint, 1024,
                         Deadline::AfterMs(3000));
  EXPECT_FALSE(posing.ok());
  // Without keys at all (a plain stream to a sealed port): no answer.
  auto plain = TimeLink(Options(wire::ProbeIdentity("b"), {}, nullptr), endpoint, 1024,
                        Deadline::AfterMs(3000));
  EXPECT_FALSE(plain.ok());
}

}  // namespace
}  // namespace gradsync::client
