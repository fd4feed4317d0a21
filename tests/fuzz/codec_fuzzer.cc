// libFuzzer target over what a receiver does with a peer's codec spec and
// compressed payload (compression/registry.h, compression/compressor.h):
// the spec string (DataBody.codec) is parsed and built, a compressor that
// builds must round-trip values through exactly WireBytes(n) bytes, and the
// peer's bytes are decompressed into room for exactly n floats. Half the
// inputs decompress (the valid payload and the peer's) while another thread
// keeps rewriting it, as a
// peer can while a receiver decodes from shared memory: a decoder that
// reads a byte twice (checks an index, then reads it again to use it)
// writes out of bounds. Any crash or sanitizer report is a bug.
//
// Input: byte 0 (bit 0: rewrite the payloads while they are decoded; bit 1:
// cut or zero-pad the payload to WireBytes(n), the size decoders take), bytes 1-2
// the element count n (u16, at most 4096), the spec up to a newline (at most
// 64 bytes), then the payload.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "compression/compressor.h"
#include "compression/registry.h"

namespace gradsync::fuzz {
namespace {

using compression::CompressContext;
using compression::Compressor;

constexpr size_t kMaxElements = 4096;
constexpr size_t kMaxSpec = 64;

void Check(bool ok) {
  if (!ok) std::abort();
}

// Rewrites bytes of a buffer for a moment each, from another thread, until
// stopped.
class Rewriter {
 public:
  Rewriter(uint8_t* data, size_t size) : data_(data), size_(size) {
    thread_ = std::thread([this] { Run(); });
    while (!running_.load()) std::this_thread::yield();
  }
  ~Rewriter() {
    stop_.store(true);
    thread_.join();
  }
  uint64_t writes() const { return writes_.load(std::memory_order_relaxed); }

 private:
  void Run() {
    running_.store(true);
    uint32_t x = 2463534242u;
    volatile uint8_t* p = data_;
    while (!stop_.load(std::memory_order_relaxed)) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      // A byte changes for a moment and changes back: the payload stays
      // valid most of the time, so decoders get past their checks.
      const size_t at = x % size_;
      const uint8_t was = p[at];
      p[at] = static_cast<uint8_t>(x >> 24);
      for (int spin = 0; spin < 64; ++spin) writes_.fetch_add(0, std::memory_order_relaxed);
      p[at] = was;
      writes_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  uint8_t* data_;
  size_t size_;
  std::atomic<bool> running_{false}, stop_{false};
  std::atomic<uint64_t> writes_{0};
  std::thread thread_;
};

// Decodes `payload` over and over while another thread rewrites it, until
// that thread has made a good number of writes (both ran at once) or a
// bound.
void DecodeRewritten(Compressor& c, uint8_t* payload, size_t size, size_t n,
                     const CompressContext& ctx, float* out) {
  Rewriter peer(payload, size);
  for (int i = 0; i < 512 && (i < 64 || peer.writes() < 4096); ++i) {
    (void)c.Decompress(payload, size, n, ctx, out);
  }
}

// Compress and decompress must agree on the format they define; the valid
// payload is then decoded again while it is rewritten.
void RoundTrip(Compressor& c, const uint8_t* data, size_t size, size_t n,
               const CompressContext& ctx, bool rewrite) {
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) {
    in[i] = i < size ? static_cast<float>(static_cast<int8_t>(data[i])) / 8.0f : 0.0f;
  }
  const size_t bytes = c.WireBytes(n);
  std::unique_ptr<uint8_t[]> wire(new uint8_t[std::max<size_t>(bytes, 1)]);
  std::unique_ptr<float[]> out(new float[std::max<size_t>(n, 1)]);
  Check(c.Compress(in.data(), n, ctx, wire.get(), bytes).ok());
  Check(c.Decompress(wire.get(), bytes, n, ctx, out.get()).ok());
  for (size_t i = 0; i < n; ++i) Check(std::isfinite(out[i]));
  if (rewrite && bytes > 0) DecodeRewritten(c, wire.get(), bytes, n, ctx, out.get());
}

// The peer's bytes, in storage of exactly their size, into room for
// exactly n floats.
void Hostile(Compressor& c, const uint8_t* data, size_t size, size_t n, const CompressContext& ctx,
             bool rewrite, bool fit) {
  std::vector<uint8_t> fitted;
  if (fit) {
    fitted.assign(data, data + size);
    fitted.resize(c.WireBytes(n));
    data = fitted.data();
    size = fitted.size();
  }
  std::unique_ptr<uint8_t[]> payload(new uint8_t[std::max<size_t>(size, 1)]);
  if (size > 0) std::memcpy(payload.get(), data, size);
  std::unique_ptr<float[]> out(new float[std::max<size_t>(n, 1)]);
  if (!rewrite || size == 0) {
    (void)c.Decompress(payload.get(), size, n, ctx, out.get());
    return;
  }
  DecodeRewritten(c, payload.get(), size, n, ctx, out.get());
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace f = gradsync::fuzz;
  namespace c = gradsync::compression;
  if (size < 3) return 0;
  static c::CompressorRegistry* registry = [] {
    auto* r = new c::CompressorRegistry();
    c::RegisterBuiltins(r);
    return r;
  }();
  const bool rewrite = data[0] & 1;
  const bool fit = data[0] & 2;
  const size_t n = (data[1] | (size_t{data[2]} << 8)) % (f::kMaxElements + 1);
  data += 3;
  size -= 3;
  const size_t cut = std::min(size, f::kMaxSpec);
  const uint8_t* nl = static_cast<const uint8_t*>(std::memchr(data, '\n', cut));
  const size_t spec_size = nl ? static_cast<size_t>(nl - data) : cut;
  const std::string spec(reinterpret_cast<const char*>(data), spec_size);
  data += std::min(size, spec_size + 1);
  size -= std::min(size, spec_size + 1);

  auto parsed = c::ParseCompressorSpec(spec);
  auto made = registry->Create(spec);
  if (!made.ok()) return 0;
  f::Check(parsed.ok() && *made != nullptr);
  c::CompressContext ctx;
  ctx.seed = 7;
  ctx.step = n;
  f::RoundTrip(**made, data, size, n, ctx, rewrite);
  f::Hostile(**made, data, size, n, ctx, rewrite, fit);
  return 0;
}
