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
//   tcp_stream     two wire::TcpStreamTransports, a connection each way
//                  that the threads write and read themselves (what a ring
//                  without CURVE between hosts runs).
//   ring_tcp       two client::RingCollectives (ranks 0 and 1, one thread
//                  each) over zmq_transport, back-to-back fp32 sum
//                  all-reduces of --bytes: per operation, not one way (with
//                  2 ranks one small all-reduce is one one-way trip per rank
//                  plus the ring's own work: the difference is that work);
//   ring_stream    the same over tcp_stream;
//   ring_shm       the same over shm_link.
//
//   bazel run --config=opt //bench:latency_bench -- [--bytes=4096] [--rounds=20000]
//
// Prints one line per layer and one JSON line each:
// {"layer","bytes","one_way_p50_us","one_way_p10_us","one_way_p90_us"}
// (op_p50_us ... for the ring layers).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "client/ring.h"
#include "common/config.h"
#include "common/status.h"
#include "common/time.h"
#include "wire/message.h"
#include "wire/same_host_transport.h"
#include "wire/tcp_stream_transport.h"
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
  wire::RingDataFields f;
  f.dtype = wire::DType::U8;
  f.num_elements = bytes;
  std::vector<uint8_t> payload(bytes, 7);
  return wire::MakeRingData(wire::Sender{wire::Role::Worker, 0, 1}, f,
                            {wire::Payload::Copy(payload.data(), payload.size())}, 0, 0);
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

enum class Layer { kZmq, kShm, kStream };

// Two ZeroMQ transports listening on loopback (`inner`) and the ends to use:
// those, or (kShm) a SameHostTransport over each with a shared-memory link
// each way, or (kStream) two TCP stream transports instead.
struct Pair {
  std::vector<std::unique_ptr<wire::ZmqTransport>> inner;
  std::vector<std::unique_ptr<wire::SameHostTransport>> links;
  std::vector<std::unique_ptr<wire::TcpStreamTransport>> streams;
  std::vector<wire::Transport*> ends;
  std::vector<std::string> endpoints;
};

StatusOr<Pair> MakePair(Layer layer) {
  Pair p;
  if (layer == Layer::kStream) {
    const std::string names[2] = {"end-0", "end-1"};
    for (int i = 0; i < 2; ++i) {
      wire::TcpStreamOptions o;
      o.job_id = 1;
      o.identity = names[i];
      o.accept = {names[1 - i]};
      p.streams.push_back(std::make_unique<wire::TcpStreamTransport>(o));
      GS_ASSIGN_OR_RETURN(std::string e, p.streams.back()->Listen("tcp://127.0.0.1:0"));
      p.endpoints.push_back(e);
      p.ends.push_back(p.streams.back().get());
    }
    return p;
  }
  const bool shm = layer == Layer::kShm;
  for (int i = 0; i < 2; ++i) {
    GS_ASSIGN_OR_RETURN(auto t, wire::ZmqTransport::Create({}));
    GS_ASSIGN_OR_RETURN(std::string e, t->Listen("tcp://127.0.0.1:0"));
    p.endpoints.push_back(e);
    p.inner.push_back(std::move(t));
  }
  const uint64_t job = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  for (int i = 0; i < 2; ++i) {
    if (!shm) {
      p.ends.push_back(p.inner[static_cast<size_t>(i)].get());
      continue;
    }
    wire::SameHostOptions o;
    o.job_id = job;
    o.peers.push_back({p.inner[static_cast<size_t>(1 - i)]->identity(),
                       p.endpoints[static_cast<size_t>(1 - i)], true, true});
    p.links.push_back(
        std::make_unique<wire::SameHostTransport>(p.inner[static_cast<size_t>(i)].get(), o));
    p.ends.push_back(p.links.back().get());
  }
  return p;
}

StatusOr<Result> PingPongOver(Layer layer, size_t bytes, int rounds) {
  GS_ASSIGN_OR_RETURN(Pair p, MakePair(layer));
  GS_ASSIGN_OR_RETURN(wire::ConnId a_to_b, p.ends[0]->Connect(p.endpoints[1]));
  GS_ASSIGN_OR_RETURN(wire::ConnId b_to_a, p.ends[1]->Connect(p.endpoints[0]));
  return PingPong(*p.ends[0], a_to_b, *p.ends[1], b_to_a, bytes, rounds);
}

StatusOr<Result> ZmqTransports(size_t bytes, int rounds) {
  return PingPongOver(Layer::kZmq, bytes, rounds);
}
StatusOr<Result> ShmLinks(size_t bytes, int rounds) {
  return PingPongOver(Layer::kShm, bytes, rounds);
}
StatusOr<Result> TcpStreams(size_t bytes, int rounds) {
  return PingPongOver(Layer::kStream, bytes, rounds);
}

// Per operation (microseconds) of rank 0, the other rank running alongside.
StatusOr<Result> Rings(Layer layer, size_t bytes, int rounds) {
  GS_ASSIGN_OR_RETURN(Pair pair, MakePair(layer));
  std::vector<std::unique_ptr<client::RingCollectives>> rings;
  for (int r = 0; r < 2; ++r) {
    client::RingPeers peers;
    peers.rank = r;
    peers.world_size = 2;
    peers.right_endpoint = pair.endpoints[static_cast<size_t>(1 - r)];
    peers.sender = wire::Sender{wire::Role::Worker, r, 1};
    if (layer == Layer::kStream)
      peers.left_identity = pair.ends[static_cast<size_t>(1 - r)]->identity();
    GS_ASSIGN_OR_RETURN(auto ring, client::RingCollectives::Create(
                                       pair.ends[static_cast<size_t>(r)], peers, {}, nullptr));
    rings.push_back(std::move(ring));
  }
  const size_t count = std::max<size_t>(1, bytes / sizeof(float));
  std::vector<std::vector<float>> data(2, std::vector<float>(count, 1.0f));
  uint64_t seq[2] = {0, 0};
  auto op = [&](int r) {
    client::OpTag tag;
    tag.seq = seq[r]++;
    tag.step = tag.seq;
    return rings[static_cast<size_t>(r)]->AllReduce(data[static_cast<size_t>(r)].data(), count,
                                                    DType::kF32, client::ReduceOp::kSum, tag,
                                                    Deadline::AfterMs(10000));
  };
  const int total = rounds + rounds / 10 + 10;  // Time's warm-up and timed rounds
  Status other;
  std::thread rank1([&] {
    for (int i = 0; i < total && other.ok(); ++i) other = op(1);
  });
  Status mine;
  auto per_op = Time(rounds, [&] {
    if (mine.ok()) mine = op(0);
  });
  rank1.join();
  GS_RETURN_IF_ERROR(mine);
  GS_RETURN_IF_ERROR(other);
  for (double& t : per_op) t *= 2;  // Summarise halves round trips
  return Summarise(std::move(per_op));
}

StatusOr<Result> RingTcp(size_t bytes, int rounds) { return Rings(Layer::kZmq, bytes, rounds); }
StatusOr<Result> RingStream(size_t bytes, int rounds) {
  return Rings(Layer::kStream, bytes, rounds);
}
StatusOr<Result> RingShm(size_t bytes, int rounds) { return Rings(Layer::kShm, bytes, rounds); }

// The ring layers are timed per operation, the others one way.
const char* Measure(const std::string& layer) {
  return layer.rfind("ring_", 0) == 0 ? "op" : "one_way";
}

void Print(const char* layer, size_t bytes, const Result& r) {
  std::printf("%-14s %8zu B  %-7s p10 %8.1f us  p50 %8.1f us  p90 %8.1f us\n", layer, bytes,
              Measure(layer), r.p10, r.p50, r.p90);
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
  for (auto [name, run] :
       {std::pair<const char*, StatusOr<Result> (*)(size_t, int)>{"zmq_transport", ZmqTransports},
        {"shm_link", ShmLinks},
        {"tcp_stream", TcpStreams},
        {"ring_tcp", RingTcp},
        {"ring_stream", RingStream},
        {"ring_shm", RingShm}}) {
    auto got = run(n, r);
    if (!got.ok()) {
      std::fprintf(stderr, "latency_bench: %s: %s\n", name, got.status().ToString().c_str());
      return 1;
    }
    rows.emplace_back(name, *got);
  }
  for (const auto& [name, res] : rows) Print(name, n, res);
  for (const auto& [name, res] : rows) {
    const char* m = Measure(name);
    std::printf(
        "{\"layer\":\"%s\",\"bytes\":%zu,\"%s_p50_us\":%.2f,\"%s_p10_us\":%.2f,"
        "\"%s_p90_us\":%.2f}\n",
        name, n, m, res.p50, m, res.p10, m, res.p90);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync::bench

int main(int argc, char** argv) { return gradsync::bench::Main(argc, argv); }
