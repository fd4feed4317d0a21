// Structure-aware libFuzzer target for the CPU ring's receive path. Rank 1
// of a 2-rank ring (a real RingCollectives on the in-process transport)
// runs one collective while the fuzzer plays its left neighbour, rank 0,
// under rank 0's own identity, and sends it a sequence of well-formed
// messages whose fields it picks: RingData with the operation's fingerprint
// or another, message indices and element counts around the expected ones,
// every dtype and compression, payload frames of chosen sizes; RingAbort;
// Layout; Error; plus messages from a stranger. The collective must end (in
// success or a Status) without a crash or a sanitizer report, and a
// successful all-reduce must hold finite values.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "client/ring.h"
#include "client/ring_plan.h"
#include "wire/inproc_transport.h"
#include "wire/message.h"

namespace gradsync::fuzz {
namespace {

using client::OpTag;
using client::RingOpKind;
using wire::MsgType;

constexpr uint64_t kJob = 7;
constexpr size_t kCount = 16;  // elements of the all-reduce
const OpTag kTag{1, 2, 3, 4};

wire::Message RingData(FuzzedDataProvider& in, int as_rank) {
  wire::RingDataFields f;
  f.bucket = kTag.bucket;
  f.index = in.ConsumeIntegralInRange<uint64_t>(0, 3);
  f.dtype = static_cast<wire::DType>(in.ConsumeIntegralInRange<int>(0, 3));
  f.num_elements = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 2 * kCount)
                                    : uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 62);
  const auto kind = in.ConsumeBool() ? RingOpKind::kAllReduce : RingOpKind::kBroadcast;
  f.op_fingerprint = in.ConsumeBool()
                         ? client::RingFingerprint(kind, kTag, DType::kF32, kCount,
                                                   static_cast<uint64_t>(client::ReduceOp::kSum))
                         : in.ConsumeIntegral<uint64_t>();
  f.names_hash = kTag.names_hash;
  const size_t bytes =
      in.ConsumeBool() ? f.num_elements * 4 % 4096 : in.ConsumeIntegralInRange<size_t>(0, 256);
  std::vector<float> values(bytes / 4 + 1);
  for (float& v : values) v = static_cast<float>(in.ConsumeIntegralInRange<int>(-8, 8));
  std::vector<wire::Payload> frames;
  const int n = in.ConsumeIntegralInRange<int>(0, 2);
  for (int i = 0; i < n; ++i) frames.push_back(wire::Payload::Copy(values.data(), bytes));
  return wire::MakeRingData(wire::Sender{wire::Role::Worker, as_rank, kJob}, f, std::move(frames),
                            kTag.step, kTag.seq);
}

wire::Message Other(FuzzedDataProvider& in, int as_rank) {
  const wire::Sender from{wire::Role::Worker, as_rank, kJob};
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      wire::RingAbortFields a;
      a.origin_rank = in.ConsumeIntegralInRange<int>(-1, 2);
      a.blamed_rank = in.ConsumeIntegralInRange<int>(-1, 2);
      a.received = in.ConsumeIntegralInRange<uint64_t>(0, 4);
      a.timed_out = in.ConsumeBool();
      a.code = static_cast<wire::ErrorCode>(
          in.ConsumeIntegralInRange<int>(0, static_cast<int>(wire::ErrorCode::MAX)));
      a.message = in.ConsumeRandomLengthString(64);
      return wire::MakeRingAbort(from, a, kTag.step, kTag.seq);
    }
    case 1: {
      std::vector<wire::TensorSpecFields> layout(in.ConsumeIntegralInRange<size_t>(0, 3));
      for (auto& t : layout) {
        t.name = in.ConsumeRandomLengthString(16);
        t.num_elements = in.ConsumeIntegral<uint64_t>();
      }
      const uint64_t first = in.ConsumeIntegralInRange<uint64_t>(0, 4);
      return wire::MakeLayout(from, layout, first,
                              first + layout.size() + in.ConsumeIntegralInRange<uint64_t>(0, 2));
    }
    default:
      return wire::MakeError(from, wire::ErrorCode::Mismatch, in.ConsumeRandomLengthString(64),
                             MsgType::RingData);
  }
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  using namespace gradsync::fuzz;
  FuzzedDataProvider in(data, size);
  wire::InProcNetwork net;
  auto left = net.NewTransport("w0");  // the fuzzer, as rank 0
  auto stranger = net.NewTransport("x");
  auto me = net.NewTransport("w1");
  if (!left->Listen("inproc://r0").ok() || !me->Listen("inproc://r1").ok()) std::abort();
  client::RingPeers peers;
  peers.rank = 1;
  peers.world_size = 2;
  peers.right_endpoint = "inproc://r0";
  peers.sender = wire::Sender{wire::Role::Worker, 1, kJob};
  peers.left_identity = "w0";
  client::RingOptions options;
  options.chunk_bytes = 64;  // 16 floats: several chunks
  options.small_bytes = in.ConsumeBool() ? 0 : 1024;
  options.poll_interval = Millis(1);
  options.abort_grace = Millis(2);
  auto ring = client::RingCollectives::Create(me.get(), peers, options, nullptr);
  if (!ring.ok()) std::abort();
  auto to_me = left->Connect("inproc://r1");
  auto stranger_to_me = stranger->Connect("inproc://r1");
  if (!to_me.ok() || !stranger_to_me.ok()) std::abort();
  for (int i = in.ConsumeIntegralInRange<int>(1, 8); i > 0 && in.remaining_bytes() > 0; --i) {
    const bool strange = in.ConsumeIntegralInRange<int>(0, 7) == 0;
    const int as_rank = in.ConsumeIntegralInRange<int>(-1, 2);
    wire::Message msg =
        in.ConsumeIntegralInRange<int>(0, 3) > 0 ? RingData(in, as_rank) : Other(in, as_rank);
    wire::Transport& from = strange ? *stranger : *left;
    from.Send(wire::Route::Connection(strange ? *stranger_to_me : *to_me), std::move(msg),
              Deadline::AfterMs(100))
        .IgnoreError();
  }
  std::vector<float> buf(kCount, 1.0f);
  const Status s = (*ring)->AllReduce(buf.data(), kCount, DType::kF32, client::ReduceOp::kSum, kTag,
                                      Deadline::AfterMs(15));
  if (s.ok()) {
    for (float v : buf) {
      if (!std::isfinite(v)) std::abort();
    }
  }
  return 0;
}
