// Structure-aware libFuzzer target for a node's handling of what its
// scheduler sends. The fuzzer plays the scheduler (in-process transport):
// a worker's NodeAgent joins, and gets well-formed messages with chosen
// fields in answer: rank assignments (sizes, ranks, heartbeats, peer lists
// with repeated, missing or out-of-range entries), Error, JobState,
// NodeDead, BarrierRelease, NcclId and Heartbeat, before and after it took
// an assignment. Joining must end (with an assignment or a Status) within
// its deadline, and the agent must then run and stop, without a crash or a
// sanitizer report.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/node_agent.h"
#include "wire/inproc_transport.h"
#include "wire/message.h"

namespace gradsync::fuzz {
namespace {

using wire::MsgType;
using wire::Role;

constexpr uint64_t kJob = 11;

std::vector<wire::NodeInfo> Peers(FuzzedDataProvider& in) {
  std::vector<wire::NodeInfo> peers(in.ConsumeIntegralInRange<size_t>(0, 5));
  for (auto& p : peers) {
    p.role = static_cast<Role>(in.ConsumeIntegralInRange<int>(0, 2));
    p.rank = in.ConsumeIntegralInRange<int>(-1, 3);
    p.host = in.ConsumeBool() ? "127.0.0.1" : in.ConsumeRandomLengthString(16);
    p.data_port = in.ConsumeIntegral<uint16_t>();
    p.identity = in.ConsumeRandomLengthString(8);
  }
  return peers;
}

wire::Message NextMessage(FuzzedDataProvider& in) {
  const wire::Sender from{Role::Scheduler, -1, in.ConsumeBool() ? kJob : 0};
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0:
    case 1:
      return wire::MakeRankAssignment(
          from, in.ConsumeIntegralInRange<int>(-1, 3), in.ConsumeIntegralInRange<int>(-1, 3),
          in.ConsumeIntegralInRange<int>(-1, 2), Peers(in),
          in.ConsumeIntegralInRange<uint32_t>(0, 50), in.ConsumeIntegralInRange<uint32_t>(0, 4));
    case 2:
      return wire::MakeError(from,
                             static_cast<wire::ErrorCode>(in.ConsumeIntegralInRange<int>(
                                 0, static_cast<int>(wire::ErrorCode::MAX))),
                             in.ConsumeRandomLengthString(32), MsgType::Register);
    case 3:
      return wire::MakeJobState(from,
                                static_cast<wire::JobPhase>(in.ConsumeIntegralInRange<int>(0, 2)),
                                in.ConsumeRandomLengthString(32));
    case 4: {
      wire::NodeInfo dead;
      dead.role = static_cast<Role>(in.ConsumeIntegralInRange<int>(0, 2));
      dead.rank = in.ConsumeIntegralInRange<int>(-1, 3);
      return wire::MakeNodeDead(from, dead, in.ConsumeRandomLengthString(32));
    }
    case 5:
      return wire::MakeBarrier(from, MsgType::BarrierRelease, in.ConsumeIntegral<uint64_t>(),
                               static_cast<wire::Group>(in.ConsumeIntegralInRange<int>(0, 2)),
                               in.ConsumeIntegralInRange<uint32_t>(0, 2));
    default:
      return wire::MakeNcclId(from, MsgType::NcclId,
                              in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange(0, 200)));
  }
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  using namespace gradsync::fuzz;
  FuzzedDataProvider in(data, size);
  wire::InProcNetwork net;
  auto scheduler = net.NewTransport("scheduler");
  if (!scheduler->Listen("tcp://sched:1").ok()) std::abort();
  cluster::NodeOptions options;
  options.scheduler = "sched:1";
  options.num_workers = in.ConsumeBool() ? 2 : -1;
  options.num_servers = in.ConsumeBool() ? 1 : -1;
  options.rendezvous_timeout = Millis(30);
  options.connect_timeout = Millis(30);
  options.heartbeat_interval = Millis(5);
  StatusOr<std::unique_ptr<cluster::NodeAgent>> agent = UnavailableError("not joined");
  std::thread join([&] {
    agent = cluster::NodeAgent::Join(options, net.NewTransport("node"), Deadline::AfterMs(60));
  });
  // Answer the registration with the fuzzed messages.
  auto reg = scheduler->Receive(Deadline::AfterMs(60));
  if (reg.ok()) {
    for (int i = in.ConsumeIntegralInRange<int>(1, 6); i > 0 && in.remaining_bytes() > 0; --i) {
      scheduler->Send(reg->from, NextMessage(in), Deadline::AfterMs(20)).IgnoreError();
    }
  }
  join.join();
  if (agent.ok()) {
    for (int i = in.ConsumeIntegralInRange<int>(0, 6); i > 0 && in.remaining_bytes() > 0; --i) {
      scheduler->Send(reg->from, NextMessage(in), Deadline::AfterMs(20)).IgnoreError();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    (void)(*agent)->job_status();
    (void)(*agent)->dead_peers();
    agent->reset();
  }
  return 0;
}
