// Structure-aware libFuzzer target for a parameter-server shard's key table:
// each input is a sequence of well-formed Push and Pull messages (valid
// FlatBuffers headers, payload frames of chosen sizes) whose fields the
// fuzzer picks from ranges that matter (ranks around the job's, keys on and
// off this shard, element counts up to 2^62, rounds around the open window,
// every compression family with valid and broken codecs), interleaved with
// worker deaths, run through Validate and KeyTable::Handle as a shard does.
// A crash, a sanitizer report, an answer that does not validate, or a
// table that breaks its invariants (rounds left open below the closed one,
// a key larger than a partition, more keys than allowed) is a bug.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "compression/registry.h"
#include "compression/wire_codec.h"
#include "ps/optimizer.h"
#include "ps/ps_key_table.h"
#include "wire/message.h"
#include "wire/validate.h"

namespace gradsync::fuzz {
namespace {

using server::KeyTable;
using server::PsMode;
using server::PsRules;
using wire::MsgType;

constexpr uint64_t kJob = 42;
constexpr int kWorkers = 3;

const char* const kCodecs[] = {"fp16",
                               "bf16",
                               "topk:ratio=0.25",
                               "topk_fp16:ratio=0.5",
                               "randomk:ratio=0.25",
                               "sign:chunk=4",
                               "qsgd:chunk=4,levels=8",
                               "topk_sampled:ratio=0.5",
                               "none",
                               "lz4",
                               "topk:ratio=9",
                               "sign:chunk=0",
                               ""};

std::string Identity(int worker) { return "worker" + std::to_string(worker); }

// The bytes a codec writes for n elements, when the codec exists and n is
// small enough to ask.
size_t WireBytesOf(const std::string& codec, uint64_t n) {
  static compression::CompressorRegistry* registry = [] {
    auto* r = new compression::CompressorRegistry();
    compression::RegisterBuiltins(r);
    return r;
  }();
  if (n > 4096) return 0;
  auto c = registry->Create(codec);
  return c.ok() ? (*c)->WireBytes(n) : 0;
}

wire::Message NextMessage(FuzzedDataProvider& in) {
  const bool push = in.ConsumeBool();
  const int worker = in.ConsumeIntegralInRange<int>(-1, kWorkers);
  wire::DataFields f;
  f.bucket = in.ConsumeIntegralInRange<uint32_t>(0, 2);
  f.partition = in.ConsumeIntegralInRange<uint32_t>(0, 5);
  f.num_elements = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 48)
                                    : uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 62);
  f.round = in.ConsumeIntegralInRange<uint64_t>(0, 6);
  f.base_version = in.ConsumeIntegralInRange<uint64_t>(0, 6);
  f.dtype = in.ConsumeBool() ? wire::DType::F32
                             : static_cast<wire::DType>(in.ConsumeIntegralInRange<int>(0, 3));
  if (in.ConsumeBool()) f.codec = in.PickValueInArray(kCodecs);
  std::vector<wire::Payload> payloads;
  if (push) {
    size_t bytes = f.codec.empty() ? (f.num_elements <= 4096 ? f.num_elements * 4 : 0)
                                   : WireBytesOf(f.codec, f.num_elements);
    if (in.ConsumeBool()) bytes = in.ConsumeIntegralInRange<size_t>(0, 512);
    const std::vector<uint8_t> data = in.ConsumeBytes<uint8_t>(bytes);
    std::vector<uint8_t> full(bytes, 0);
    std::copy(data.begin(), data.end(), full.begin());
    payloads.push_back(wire::Payload::Copy(full.data(), full.size()));
  }
  return wire::MakeData(wire::Sender{wire::Role::Worker, worker, kJob},
                        push ? MsgType::Push : MsgType::Pull, f, std::move(payloads), f.round,
                        f.round);
}

void CheckTable(const KeyTable& table, const PsRules& rules) {
  if (table.keys().size() > rules.max_keys) std::abort();
  for (const auto& [key, k] : table.keys()) {
    if (k.num_elements > rules.max_elements) std::abort();
    if (!k.open.empty() && k.open.begin()->first <= k.closed) std::abort();
    if (k.results.size() > rules.kept_results + 1) std::abort();
    for (const auto& [round, by_worker] : k.open) {
      for (const auto& [w, c] : by_worker) {
        if (w < 0 || w >= rules.num_workers || c.grad.size() != k.num_elements) std::abort();
      }
    }
  }
}

void CheckAnswers(const std::vector<server::Outgoing>& out) {
  static const wire::Policy answers =
      wire::Policy::Accepting({MsgType::Ack, MsgType::Reply, MsgType::Error});
  for (const server::Outgoing& o : out) {
    if (!wire::Validate(o.message, answers).ok()) std::abort();
  }
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  using namespace gradsync::fuzz;
  FuzzedDataProvider in(data, size);
  PsRules rules;
  rules.mode = static_cast<PsMode>(in.ConsumeIntegralInRange<int>(0, 2));
  rules.staleness = rules.mode == PsMode::kSsp ? in.ConsumeIntegralInRange<uint64_t>(0, 2) : 0;
  rules.num_workers = kWorkers;
  rules.num_shards = 2;
  rules.max_elements = 64;
  rules.max_keys = 4;
  for (int w = 0; w < kWorkers; ++w) rules.worker_identities.push_back(Identity(w));
  server::OptimizerOptions opt;
  opt.kind = rules.mode == PsMode::kSync && in.ConsumeBool() ? server::OptimizerKind::kNone
                                                             : server::OptimizerKind::kMomentum;
  auto optimizer = server::MakeOptimizer(opt);
  server::ShardCounters counters;
  KeyTable table(rules, optimizer.get(), wire::Sender{wire::Role::Server, 0, kJob}, &counters);
  wire::Policy policy = wire::Policy::Accepting({MsgType::Push, MsgType::Pull});
  policy.job_id = kJob;
  std::set<int32_t> dead;
  while (in.remaining_bytes() > 0) {
    std::vector<server::Outgoing> out;
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      dead.insert(in.ConsumeIntegralInRange<int>(0, kWorkers - 1));
      table.SetDead(dead, &out);
    } else {
      const wire::Message msg = NextMessage(in);
      const int from = in.ConsumeIntegralInRange<int>(0, kWorkers);
      const wire::Verdict v = wire::Validate(msg, policy);
      if (v.ok()) {
        table.Handle(wire::Route::Inbound(Identity(from)), *v.header, msg, &out);
      }
    }
    CheckAnswers(out);
    CheckTable(table, rules);
  }
  return 0;
}
