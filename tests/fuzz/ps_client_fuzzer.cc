// Structure-aware libFuzzer target for the parameter-server client's reply
// path. A real PsClient (two shards, partitions of 16 floats, replies in
// f32, fp16 or bf16) runs two all-reduces on a thread while the fuzzer plays
// both shards: it answers each Push and Pull it receives with a message whose
// fields it picks (a correct Reply or Ack, one with another bucket, round,
// partition, element count, dtype, codec or payload size, a Busy or
// other Error, a message of another type, or nothing), and sometimes sends
// first. Every call must end (success or a Status) within its deadline,
// without a crash or a sanitizer report.
#include <fuzzer/FuzzedDataProvider.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/ps_client.h"
#include "wire/inproc_transport.h"
#include "wire/message.h"

namespace gradsync::fuzz {
namespace {

using wire::MsgType;

constexpr uint64_t kJob = 7;
constexpr int kShards = 2;
constexpr size_t kCount = 40;  // elements of each all-reduce: 3 partitions
const char* const kReplyCodecs[] = {"", "fp16", "bf16"};

// The answer to `request` (a Push or Pull of the client) that the fuzzer
// picks; false: no answer.
bool Answer(FuzzedDataProvider& in, const wire::Verdict& request, int shard,
            const std::string& reply_codec, wire::Message* out) {
  const wire::Sender from{wire::Role::Server, shard, kJob};
  const int choice = in.ConsumeIntegralInRange<int>(0, 9);
  if (choice == 8) return false;
  if (choice == 7) {
    const auto code = static_cast<wire::ErrorCode>(
        in.ConsumeIntegralInRange<int>(0, static_cast<int>(wire::ErrorCode::MAX)));
    *out = wire::MakeError(from, code, in.ConsumeRandomLengthString(64), request.type);
    return true;
  }
  const wire::DataBody* asked = request.header->body_as_DataBody();
  wire::DataFields f;
  f.bucket = asked->bucket();
  f.partition = asked->partition();
  f.dtype = wire::DType::F32;
  f.num_elements = asked->num_elements();
  f.round = asked->round();
  f.key_version = asked->base_version() + 1;
  f.names_hash = asked->names_hash();
  f.codec = reply_codec;
  size_t bytes = f.num_elements * (reply_codec.empty() ? 4 : 2);
  switch (choice) {  // 0..2: correct; the rest change one thing
    case 3:
      f.bucket = in.ConsumeIntegralInRange<uint32_t>(0, 3);
      f.partition = in.ConsumeIntegralInRange<uint32_t>(0, 5);
      f.round = in.ConsumeIntegralInRange<uint64_t>(0, 3);
      break;
    case 4:
      f.num_elements = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 2 * kCount)
                                        : uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 62);
      break;
    case 5:
      f.dtype = static_cast<wire::DType>(in.ConsumeIntegralInRange<int>(0, 3));
      f.codec = in.ConsumeBool() ? in.ConsumeRandomLengthString(24) : "topk:ratio=0.5";
      break;
    case 6:
      bytes = in.ConsumeIntegralInRange<size_t>(0, 4 * kCount + 8);
      break;
    default:
      break;
  }
  std::vector<uint8_t> values(bytes);
  for (uint8_t& b : values) b = in.ConsumeIntegral<uint8_t>();
  std::vector<wire::Payload> frames;
  const bool reply = in.ConsumeIntegralInRange<int>(0, 3) != 3;
  if (reply) frames.push_back(wire::Payload::Copy(values.data(), values.size()));
  if (reply && in.ConsumeIntegralInRange<int>(0, 7) == 7) {
    frames.push_back(wire::Payload::Copy(values.data(), values.size() / 2));
  }
  *out = wire::MakeData(from, reply ? MsgType::Reply : MsgType::Ack, f, std::move(frames),
                        request.header->step(), request.header->seq());
  return true;
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  using namespace gradsync::fuzz;
  FuzzedDataProvider in(data, size);
  wire::InProcNetwork net;
  std::vector<std::unique_ptr<wire::InProcTransport>> shards;
  client::PsPeers peers;
  peers.rank = 0;
  peers.world_size = 2;
  peers.sender = wire::Sender{wire::Role::Worker, 0, kJob};
  for (int s = 0; s < kShards; ++s) {
    shards.push_back(net.NewTransport("shard" + std::to_string(s)));
    peers.server_endpoints.push_back("inproc://shard" + std::to_string(s));
    if (!shards.back()->Listen(peers.server_endpoints.back()).ok()) std::abort();
  }
  client::PsClientOptions options;
  options.partition_bytes = 64;  // 16 floats
  options.resend_after = Millis(2);
  options.poll_interval = Millis(1);
  options.server_optimizer = in.ConsumeBool();
  options.reply_codec = kReplyCodecs[in.ConsumeIntegralInRange<int>(0, 2)];
  auto client = client::PsClient::Create(net.NewTransport("worker0"), peers, options, nullptr);
  if (!client.ok()) std::abort();
  if (in.ConsumeBool() && !(*client)->SetCompression(0, "topk:ratio=0.25").ok()) std::abort();

  std::atomic<bool> done{false};
  std::thread trainer([&] {
    std::vector<float> buf(kCount, 1.0f);
    for (uint64_t step = 0; step < 2; ++step) {
      const client::OpTag tag{step, 0, step, 5};
      (*client)
          ->PushPull(buf.data(), kCount, DType::kF32, tag, Deadline::AfterMs(40))
          .IgnoreError();
    }
    done = true;
  });
  const wire::Policy policy = wire::Policy::Accepting({MsgType::Push, MsgType::Pull});
  while (!done.load()) {
    for (int s = 0; s < kShards && !done.load(); ++s) {
      auto got = shards[static_cast<size_t>(s)]->Receive(Deadline::AfterMs(1));
      if (!got.ok()) continue;
      const wire::Verdict v = wire::Validate(got->message, policy);
      // The client answers a message it refuses with an Error: not answered.
      if (!v.ok()) continue;
      wire::Message answer;
      // Once the input is spent every answer is the correct Reply.
      if (!Answer(in, v, s, options.reply_codec, &answer)) continue;
      shards[static_cast<size_t>(s)]
          ->Send(got->from, std::move(answer), Deadline::AfterMs(10))
          .IgnoreError();
    }
  }
  trainer.join();
  return 0;
}
