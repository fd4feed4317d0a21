// Structure-aware libFuzzer target for the scheduler's handling of node
// messages. A real Scheduler (2 workers, 1 server; in-process transport)
// runs on a thread while four fuzzed nodes, each with its own transport,
// send it sequences of well-formed messages with chosen fields: Register
// (role, requested rank, build, host, ports, job size), Heartbeat, Barrier,
// ReachReport, NcclIdOffer/Request, Leave, Error, under job id 0, the id of
// the job they were assigned, or another. The scheduler must neither crash
// nor trip a sanitizer, and must stop when asked.
#include <fuzzer/FuzzedDataProvider.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/version.h"
#include "scheduler/scheduler.h"
#include "wire/inproc_transport.h"
#include "wire/message.h"

namespace gradsync::fuzz {
namespace {

using wire::MsgType;
using wire::Role;

constexpr int kNodes = 4;

struct FuzzNode {
  std::unique_ptr<wire::InProcTransport> transport;
  wire::ConnId conn = -1;
  uint64_t job = 0;  // from the last assignment it got
};

wire::NodeInfo Info(FuzzedDataProvider& in, int node) {
  wire::NodeInfo n;
  n.role = in.ConsumeBool() ? Role::Worker : Role::Server;
  n.rank = in.ConsumeIntegralInRange<int>(-1, 3);
  n.host = in.ConsumeBool() ? "127.0.0.1" : in.ConsumeRandomLengthString(24);
  n.data_port = static_cast<uint16_t>(1000 + (in.ConsumeBool() ? node : 0));
  n.identity = in.ConsumeRandomLengthString(8);
  return n;
}

wire::Message NextMessage(FuzzedDataProvider& in, int node, const FuzzNode& me) {
  const uint64_t job = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? 0
                       : in.ConsumeBool()                        ? me.job
                                                                 : in.ConsumeIntegral<uint64_t>();
  const wire::Sender from{in.ConsumeBool() ? Role::Worker : Role::Server,
                          in.ConsumeIntegralInRange<int>(-1, 3), job};
  switch (in.ConsumeIntegralInRange<int>(0, 8)) {
    case 0: {
      const wire::NodeInfo n = Info(in, node);
      return wire::MakeRegister(from, n, in.ConsumeBool() ? std::string(kBuildId) : "other",
                                in.ConsumeIntegral<uint32_t>(), kProtocolVersion,
                                in.ConsumeIntegralInRange<int>(-1, 3),
                                in.ConsumeIntegralInRange<int>(-1, 2));
    }
    case 1:
      return wire::MakeHeartbeat(from);
    case 2:
      return wire::MakeBarrier(from, MsgType::Barrier, in.ConsumeIntegralInRange<uint64_t>(0, 3),
                               static_cast<wire::Group>(in.ConsumeIntegralInRange<int>(0, 2)),
                               in.ConsumeIntegralInRange<uint32_t>(0, 1));
    case 3: {
      std::vector<wire::ReachOutcome> results(in.ConsumeIntegralInRange<size_t>(0, 3));
      for (auto& r : results) {
        r.peer = Info(in, node);
        r.ok = in.ConsumeBool();
        r.detail = in.ConsumeRandomLengthString(16);
      }
      return wire::MakeReachReport(from, results);
    }
    case 4: {
      const std::vector<uint8_t> id = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange(0, 200));
      return wire::MakeNcclId(from,
                              in.ConsumeBool() ? MsgType::NcclIdOffer : MsgType::NcclIdRequest, id);
    }
    case 5:
      return wire::MakeLeave(from, in.ConsumeRandomLengthString(16));
    case 6:
      return wire::MakeError(from, wire::ErrorCode::Malformed, in.ConsumeRandomLengthString(16),
                             MsgType::Heartbeat);
    case 7: {
      // A gather part: ports that may be another node's (1000 + node) or
      // repeat, and bytes.
      wire::GatherPartFields part;
      for (size_t i = in.ConsumeIntegralInRange<size_t>(0, 4); i > 0; --i) {
        part.ports.push_back(static_cast<uint16_t>(in.ConsumeIntegralInRange<int>(0, 1004)));
      }
      part.data = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange(0, 64));
      return wire::MakeGather(from, in.ConsumeIntegralInRange<uint64_t>(0, 3), part,
                              in.ConsumeIntegralInRange<uint32_t>(0, 1));
    }
    default:
      return wire::MakeJobState(from, wire::JobPhase::Failed, in.ConsumeRandomLengthString(16));
  }
}

// Reads what came back to `n`, keeping the job id of an assignment.
void Drain(FuzzNode& n) {
  for (;;) {
    auto in = n.transport->Receive(Deadline::Past());
    if (!in.ok()) return;
    const wire::Header* h = in->message.header_view();
    if (h != nullptr && h->type() == MsgType::RankAssignment) n.job = h->job_id();
  }
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  using namespace gradsync::fuzz;
  FuzzedDataProvider in(data, size);
  wire::InProcNetwork net;
  server::SchedulerOptions options;
  options.listen = "inproc://scheduler";
  options.num_workers = 2;
  options.num_servers = 1;
  options.heartbeat_interval = Millis(20);
  options.missed_heartbeats = 2;
  options.rendezvous_timeout = Millis(500);
  options.server_grace = Millis(in.ConsumeBool() ? 0 : 30);
  RealClock clock;
  server::Scheduler scheduler(options, net.NewTransport("scheduler"), nullptr, &clock);
  if (!scheduler.Start().ok()) std::abort();
  std::atomic<bool> stop{false};
  std::thread run([&] { scheduler.Run(stop).IgnoreError(); });
  std::vector<FuzzNode> nodes(kNodes);
  for (int i = 0; i < kNodes; ++i) {
    nodes[i].transport = net.NewTransport("n" + std::to_string(i));
    nodes[i].conn = *nodes[i].transport->Connect("inproc://scheduler");
  }
  for (int batch = 0; batch < 4 && in.remaining_bytes() > 0; ++batch) {
    for (int i = in.ConsumeIntegralInRange<int>(1, 6); i > 0 && in.remaining_bytes() > 0; --i) {
      const int node = in.ConsumeIntegralInRange<int>(0, kNodes - 1);
      FuzzNode& n = nodes[node];
      n.transport
          ->Send(wire::Route::Connection(n.conn), NextMessage(in, node, n), Deadline::AfterMs(50))
          .IgnoreError();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (FuzzNode& n : nodes) Drain(n);
  }
  stop.store(true);
  run.join();
  return 0;
}
