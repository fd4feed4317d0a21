// Test helpers: a ring of RingCollectives over the in-process transport,
// one thread per rank.
#ifndef GRADSYNC_CLIENT_RING_TEST_UTIL_H_
#define GRADSYNC_CLIENT_RING_TEST_UTIL_H_

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/ring.h"
#include "cluster/ring_order.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "wire/inproc_transport.h"

namespace gradsync::client {

constexpr uint64_t kJob = 77;
constexpr size_t kChunkBytes = 4096;  // 1024 f32 elements per chunk

// Runs fn(rank) for ranks 0 to n - 1, one thread each; returns each rank's
// status.
inline std::vector<Status> RunRanks(int n, const std::function<Status(int)>& fn) {
  std::vector<Status> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (auto& t : threads) t.join();
  return out;
}

class Ring {
 public:
  // `order`: the ranks in ring order (RingPeers::order); empty: by rank.
  Ring(int n, RingOptions options = RingOptions(), HealthCheck health = nullptr,
       std::vector<int> order = {})
      : n_(n) {
    for (int r = 0; r < n; ++r) {
      transports_.push_back(net_.NewTransport("w" + std::to_string(r)));
      EXPECT_TRUE(transports_.back()->Listen(Endpoint(r)).ok());
    }
    for (int r = 0; r < n; ++r) {
      const cluster::RingNeighbours next = cluster::NeighboursOf(order, r, n);
      RingPeers p;
      p.rank = r;
      p.world_size = n;
      p.order = order;
      p.right_endpoint = Endpoint(next.right);
      p.sender = wire::Sender{wire::Role::Worker, r, kJob};
      p.left_identity = "w" + std::to_string(next.left);
      auto ring = RingCollectives::Create(transports_[r].get(), p, options, health);
      EXPECT_TRUE(ring.ok()) << ring.status().ToString();
      rings_.push_back(std::move(*ring));
    }
  }

  static std::string Endpoint(int r) { return "inproc://rank" + std::to_string(r); }
  RingCollectives& operator[](int r) { return *rings_[r]; }
  wire::InProcNetwork& net() { return net_; }
  // Destroys rank r's transport, and with it whatever it had received and
  // not handed out (its ring stays, not to be used again).
  void DropTransport(int r) {
    transports_[r]->Shutdown();
    transports_[r].reset();
  }

  // Runs fn(rank) on one thread per rank; returns each rank's status.
  std::vector<Status> Run(const std::function<Status(int)>& fn) { return RunRanks(n_, fn); }

 private:
  int n_;
  wire::InProcNetwork net_;
  std::vector<std::unique_ptr<wire::InProcTransport>> transports_;
  std::vector<std::unique_ptr<RingCollectives>> rings_;
};

inline RingOptions SmallChunks() {
  RingOptions o;
  o.chunk_bytes = kChunkBytes;
  o.small_bytes = 0;  // always the chunked reduce-scatter + all-gather
  return o;
}

// Integer values in [-8, 8]: every sum is exact in f32, f16 and bf16.
inline float IntValue(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 17) - 8);
}

inline void Encode(const std::vector<float>& in, DType dtype, std::vector<uint8_t>* out) {
  out->resize(in.size() * DTypeSize(dtype));
  if (dtype == DType::kF32 && !in.empty()) std::memcpy(out->data(), in.data(), 4 * in.size());
  if (dtype == DType::kF16) FloatToHalf(in.data(), out->data(), in.size());
  if (dtype == DType::kBF16) FloatToBf16(in.data(), out->data(), in.size());
}

inline OpTag Tag(uint64_t seq) { return OpTag{3, 1, seq, 0xabc}; }

inline Deadline Soon() { return Deadline::After(std::chrono::seconds(60)); }

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_RING_TEST_UTIL_H_
