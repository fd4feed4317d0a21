// latency_bench: where the time of a small message goes, layer by layer.
// Two threads of one process bounce a message back and forth (ping-pong)
// and the one-way latency is half the round trip, median over rounds:
//   raw_zmq        two ZeroMQ DEALER sockets over loopback TCP, no gradsync
//                  code: what ZeroMQ itself costs;
//   zmq_transport  two wire::ZmqTransports over loopback TCP (a header frame
//                  and one payload frame): ZeroMQ plus our I/O threads and
//                  hand-offs;
//   shm_link       two wire::SameHostTransports over one shared-memory link
//                  each way (the inner transports idle).
// A ring all-reduce of N ranks adds its own per-operation work on top (see
// allreduce_bench); with 2 ranks one small all-reduce is one such one-way
// trip per rank plus that work.
//
//   bazel run --config=opt //bench:latency_bench -- [--bytes=4096] [--rounds=20000]
//
// Prints one line per layer and one JSON line each:
// {"layer","bytes","one_way_p50_us","one_way_p10_us","one_way_p90_us"}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/config.h"
#include "common/status.h"
#include "common/time.h"
#include "wire/message.h"
#include "wire/same_host_transport.h"
#include "wire/transport.h"
#include "wire/zmq_transport.h"

extern char** environ;

namespace gradsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  double p10 = 0, p50 = 0, p90 = 0;  // one-way, microseconds
};

Result Summarise(std::vector<double> rtt_us) {
  std::sort(rtt_us.begin(), rtt_us.end());
  auto at = [&](double q) { return rtt_us[static_cast<size_t>(q * (rtt_us.size() - 1))] / 2; };
  return Result{at(0.1), at(0.5), at(0.9)};
}

// Times `rounds` round trips of `bounce` after `warmup` untimed ones.
std::vector<double> Time(int rounds, const std::function<void()>& bounce) {
  for (int i = 0; i < rounds / 10 + 10; ++i) bounce();
  std::vector<double> out;
  out.reserve(static_cast<size_t>(rounds));
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    bounce();
    out.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return out;
}

Result RawZmq(size_t bytes, int rounds) {
  zmq::context_t ctx(1);
  zmq::socket_t a(ctx, zmq::socket_type::dealer), b(ctx, zmq::socket_type::dealer);
  b.bind("tcp://127.0.0.1:0");
  a.connect(b.get(zmq::sockopt::last_endpoint));
  std::vector<uint8_t> payload(bytes, 7);
  std::thread echo([&] {
    for (;;) {
      zmq::message_t m;
      if (!b.recv(m)) continue;
      if (m.size() == 0) return;
      b.send(m, zmq::send_flags::none);
    }
  });
  auto rtt = Time(rounds, [&] {
    a.send(zmq::buffer(payload), zmq::send_flags::none);
    zmq::message_t back;
    (void)a.recv(back);
  });
  a.send(zmq::message_t(), zmq::send_flags::none);
  echo.join();
  return Summarise(std::move(rtt));
}

wire::Message Sized(size_t bytes) {
  wire::DataFields f;
  f.dtype = wire::DType::U8;
  f.num_elements = bytes;
  std::vector<uint8_t> payload(bytes, 7);
  return wire::MakeData(wire::Sender{wire::Role::Worker, 0, 1}, wire::MsgType::RingData, f,
                        {wire::Payload::Copy(payload.data(), payload.size())});
}

// A ping-pong between `a` (connected to b as a_to_b) and `b` (connected
// back as b_to_a).
StatusOr<Result> PingPong(wire::Transport& a, wire::ConnId a_to_b, wire::Transport& b,
                          wire::ConnId b_to_a, size_t bytes, int rounds) {
  const wire::Message msg = Sized(bytes);
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    while (!stop.load()) {
      auto in = b.Receive(Deadline::AfterMs(100));
      if (!in.ok()) continue;
      b.Send(wire::Route::Connection(b_to_a), std::move(in->message), Deadline::AfterMs(5000))
          .IgnoreError();
    }
  });
  Status failed;
  auto rtt = Time(rounds, [&] {
    if (!failed.ok()) return;
    failed = a.Send(wire::Route::Connection(a_to_b), msg, Deadline::AfterMs(5000));
    if (failed.ok()) failed = a.Receive(Deadline::AfterMs(5000)).status();
  });
  stop = true;
  echo.join();
  GS_RETURN_IF_ERROR(failed);
  return Summarise(std::move(rtt));
}

StatusOr<Result> ZmqTransports(size_t bytes, int rounds) {
  GS_ASSIGN_OR_RETURN(auto a, wire::ZmqTransport::Create({}));
  GS_ASSIGN_OR_RETURN(auto b, wire::ZmqTransport::Create({}));
  GS_ASSIGN_OR_RETURN(std::string ea, a->Listen("tcp://127.0.0.1:0"));
  GS_ASSIGN_OR_RETURN(std::string eb, b->Listen("tcp://127.0.0.1:0"));
  GS_ASSIGN_OR_RETURN(wire::ConnId a_to_b, a->Connect(eb));
  GS_ASSIGN_OR_RETURN(wire::ConnId b_to_a, b->Connect(ea));
  return PingPong(*a, a_to_b, *b, b_to_a, bytes, rounds);
}

StatusOr<Result> ShmLinks(size_t bytes, int rounds) {
  GS_ASSIGN_OR_RETURN(auto ia, wire::ZmqTransport::Create({}));
  GS_ASSIGN_OR_RETURN(auto ib, wire::ZmqTransport::Create({}));
  GS_ASSIGN_OR_RETURN(std::string ea, ia->Listen("tcp://127.0.0.1:0"));
  GS_ASSIGN_OR_RETURN(std::string eb, ib->Listen("tcp://127.0.0.1:0"));
  const uint64_t job = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  wire::SameHostOptions oa, ob;
  oa.job_id = ob.job_id = job;
  oa.right_endpoint = eb;
  oa.shm_right = true;
  oa.left_identity = ib->identity();
  oa.shm_left = true;
  ob.right_endpoint = ea;
  ob.shm_right = true;
  ob.left_identity = ia->identity();
  ob.shm_left = true;
  wire::SameHostTransport a(ia.get(), oa), b(ib.get(), ob);
  GS_ASSIGN_OR_RETURN(wire::ConnId a_to_b, a.Connect(eb));
  GS_ASSIGN_OR_RETURN(wire::ConnId b_to_a, b.Connect(ea));
  return PingPong(a, a_to_b, b, b_to_a, bytes, rounds);
}

void Print(const char* layer, size_t bytes, const Result& r) {
  std::printf("%-14s %8zu B  one-way p10 %8.1f us  p50 %8.1f us  p90 %8.1f us\n", layer, bytes,
              r.p10, r.p50, r.p90);
}

int Main(int argc, char** argv) {
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) {
    std::fprintf(stderr, "latency_bench: %s\n", config.status().ToString().c_str());
    return 2;
  }
  auto bytes_flag = config->GetInt("bytes", 4096);
  auto rounds_flag = config->GetInt("rounds", 20000);
  const int64_t bytes = bytes_flag.ok() ? *bytes_flag : 0;
  const int64_t rounds = rounds_flag.ok() ? *rounds_flag : 0;
  if (bytes < 1 || rounds < 10) {
    std::fprintf(stderr, "latency_bench: need --bytes >= 1 and --rounds >= 10\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(bytes);
  const int r = static_cast<int>(rounds);
  std::vector<std::pair<const char*, Result>> rows;
  rows.emplace_back("raw_zmq", RawZmq(n, r));
  for (auto [name, run] : {std::pair<const char*, StatusOr<Result> (*)(size_t, int)>{
                               "zmq_transport", ZmqTransports},
                           {"shm_link", ShmLinks}}) {
    auto got = run(n, r);
    if (!got.ok()) {
      std::fprintf(stderr, "latency_bench: %s: %s\n", name, got.status().ToString().c_str());
      return 1;
    }
    rows.emplace_back(name, *got);
  }
  for (const auto& [name, res] : rows) Print(name, n, res);
  for (const auto& [name, res] : rows) {
    std::printf("{\"layer\":\"%s\",\"bytes\":%zu,\"one_way_p50_us\":%.2f,\"one_way_p10_us\":%.2f,"
                "\"one_way_p90_us\":%.2f}\n", name, n, res.p50, res.p10, res.p90);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync::bench

int main(int argc, char** argv) { return gradsync::bench::Main(argc, argv); }
