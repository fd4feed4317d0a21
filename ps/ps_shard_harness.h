// A PsShard on an in-process transport and raw workers that talk to it, for
// the shard's tests.
#ifndef GRADSYNC_PS_PS_SHARD_HARNESS_H_
#define GRADSYNC_PS_PS_SHARD_HARNESS_H_

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compression/wire_codec.h"
#include "gtest/gtest.h"
#include "ps/ps_shard.h"
#include "wire/inproc_transport.h"
#include "wire/same_host_transport.h"

namespace gradsync::server::testing {

using wire::MsgType;

constexpr uint64_t kJob = 77;

// A shard on an in-process transport and raw workers that talk to it.
class ShardHarness {
 public:
  ShardHarness(PsMode mode, OptimizerKind opt, int workers, uint64_t staleness = 0,
               const std::string& checkpoint_dir = "", uint64_t job = kJob,
               ShardMetrics* metrics = nullptr)
      : job_(job) {
    options_.metrics = metrics;
    options_.rules.mode = mode;
    options_.rules.staleness = staleness;
    options_.rules.num_workers = workers;
    options_.optimizer.kind = opt;
    options_.optimizer.lr = 0.5f;
    options_.optimizer.momentum = 0.5f;
    options_.checkpoint_dir = checkpoint_dir;
    for (int w = 0; w < workers; ++w) {
      options_.rules.worker_identities.push_back("worker" + std::to_string(w));
    }
    server_ = net_.NewTransport("shard");
    EXPECT_TRUE(server_->Listen("inproc://shard").ok());
    StartShard();
    for (int w = 0; w < workers; ++w) {
      workers_.push_back(net_.NewTransport("worker" + std::to_string(w)));
      conns_.push_back(*workers_.back()->Connect("inproc://shard"));
    }
  }
  ~ShardHarness() { shard_->Shutdown(); }

  // Stops the shard and starts a new one on the same endpoint and options,
  // as a restarted process would (of job `job`, 0: the same).
  void Restart(uint64_t job = 0) {
    shard_->Shutdown();
    shard_.reset();
    if (job != 0) job_ = job;
    StartShard();
  }

  void Send(int w, wire::Message msg) {
    ASSERT_TRUE(
        workers_[w]
            ->Send(wire::Route::Connection(conns_[w]), std::move(msg), Deadline::AfterMs(1000))
            .ok());
  }
  // As rank `as_rank` (-2: w) of membership epoch `epoch`.
  void Push(int w, uint64_t round, uint64_t version, const std::vector<float>& v,
            uint32_t partition = 0, int as_rank = -2, uint32_t epoch = 0) {
    wire::DataFields f;
    f.partition = partition;
    f.num_elements = v.size();
    f.round = round;
    f.base_version = version;
    Send(w, wire::MakeData(Sender(as_rank == -2 ? w : as_rank), MsgType::Push, f,
                           {wire::Payload::Copy(v.data(), v.size() * 4)}, /*step=*/0,
                           /*seq=*/round, epoch));
  }
  // A push of `v` compressed by `spec`, as a PS client sends it.
  void PushCompressed(int w, uint64_t round, uint64_t version, const std::vector<float>& v,
                      const std::string& spec, uint32_t partition = 0, uint32_t bucket = 0) {
    compression::CompressorRegistry registry;
    compression::RegisterBuiltins(&registry);
    auto encoder = compression::PayloadEncoder::Create(registry, spec);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    wire::DataFields f;
    f.bucket = bucket;
    f.partition = partition;
    f.num_elements = v.size();
    f.round = round;
    f.base_version = version;
    auto payload = (*encoder)->Encode(v.data(), v.size(), Context(round, partition, bucket), &f);
    ASSERT_TRUE(payload.ok()) << payload.status();
    Send(w, wire::MakeData(Sender(w), MsgType::Push, f, {*payload}, round, round));
  }
  // The context a push of `round` (sent as step `round`) is compressed with.
  compression::CompressContext Context(uint64_t round, uint32_t partition = 0,
                                       uint32_t bucket = 0) const {
    return compression::PartitionContext(job_, round, bucket, partition);
  }
  // `codec`: the encoding the Reply should have ("": fp32).
  void Pull(int w, uint64_t round, size_t n, uint32_t partition = 0, const std::string& codec = "",
            int as_rank = -2, uint32_t epoch = 0) {
    wire::DataFields f;
    f.partition = partition;
    f.num_elements = n;
    f.round = round;
    f.codec = codec;
    Send(w, wire::MakeData(Sender(as_rank == -2 ? w : as_rank), MsgType::Pull, f, {}, /*step=*/0,
                           /*seq=*/round, epoch));
  }
  // Worker w's push of gradient rows `grads` of `ids` to embedding table
  // `table` (rows of `dim`) for `round`.
  void PushRows(int w, uint32_t table, uint32_t dim, uint64_t round,
                const std::vector<uint64_t>& ids, const std::vector<float>& grads,
                uint64_t seq = 1) {
    wire::EmbeddingFields f{table, dim, ids.size(), round, 0, 1, 0};
    std::vector<wire::Payload> p;
    p.push_back(wire::Payload::Copy(ids.data(), ids.size() * sizeof(uint64_t)));
    p.push_back(wire::Payload::Copy(grads.data(), grads.size() * sizeof(float)));
    Send(w, wire::MakeEmbedding(Sender(w), MsgType::EmbeddingPush, f, std::move(p), seq, 0));
  }
  void PullRows(int w, uint32_t table, uint32_t dim, uint64_t round,
                const std::vector<uint64_t>& ids, uint64_t seq = 1) {
    wire::EmbeddingFields f{table, dim, ids.size(), round, 0, 1, 0};
    std::vector<wire::Payload> p;
    p.push_back(wire::Payload::Copy(ids.data(), ids.size() * sizeof(uint64_t)));
    Send(w, wire::MakeEmbedding(Sender(w), MsgType::EmbeddingPull, f, std::move(p), seq, 0));
  }
  // The rows of the next EmbeddingRows worker w receives (skipping acks).
  std::vector<float> Rows(int w) {
    for (;;) {
      auto m = Next(w);
      EXPECT_TRUE(m.has_value()) << "no rows";
      if (!m) return {};
      const MsgType type = m->header_view()->type();
      if (type == MsgType::EmbeddingAck) continue;
      EXPECT_EQ(type, MsgType::EmbeddingRows) << ErrorText(*m);
      if (type != MsgType::EmbeddingRows) return {};
      std::vector<float> out(m->payloads[0].size / sizeof(float));
      std::memcpy(out.data(), m->payloads[0].data, out.size() * sizeof(float));
      return out;
    }
  }

  // The next message worker w receives, or nullopt after `ms`.
  std::optional<wire::Message> Next(int w, int ms = 3000) {
    auto in = workers_[w]->Receive(Deadline::AfterMs(ms));
    if (!in.ok()) return std::nullopt;
    return std::move(in->message);
  }
  MsgType NextType(int w) {
    auto m = Next(w);
    EXPECT_TRUE(m.has_value());
    return m ? m->header_view()->type() : MsgType::Layout;
  }
  // The next Reply's values (skipping Acks); its version in *version.
  std::vector<float> Reply(int w, uint64_t* version = nullptr) {
    for (;;) {
      auto m = Next(w);
      EXPECT_TRUE(m.has_value()) << "no reply";
      if (!m) return {};
      const wire::Header* h = m->header_view();
      if (h->type() == MsgType::Ack) continue;
      EXPECT_EQ(h->type(), MsgType::Reply) << ErrorText(*m);
      if (h->type() != MsgType::Reply) return {};
      const wire::DataBody* d = h->body_as_DataBody();
      if (version) *version = d->key_version();
      std::vector<float> out(d->num_elements());
      compression::PayloadDecoder decoder;
      wire::ErrorCode code;
      Status s = decoder.Decode(*d, m->payloads, {}, out.data(), &code);
      EXPECT_TRUE(s.ok()) << s;
      return out;
    }
  }
  std::string NextError(int w) {
    auto m = Next(w);
    if (!m) return "nothing";
    return m->header_view()->type() == MsgType::Error ? ErrorText(*m) : "not an error";
  }
  static std::string ErrorText(const wire::Message& m) {
    const auto* e = m.header_view()->body_as_ErrorBody();
    return e && e->message() ? e->message()->str() : "";
  }
  // Restarts the shard on a transport that also reads a same-host link
  // from `identity` (wire/same_host_transport.h), named as LinkName(job,
  // identity, "shard") names it.
  void ListenOnSameHostLinkFrom(const std::string& identity) {
    shard_->Shutdown();
    shard_.reset();
    wire::SameHostOptions o;
    o.job_id = job_;
    o.peers = {{identity, "", false, true}};
    o.link_bytes = 4096;
    links_ = std::make_unique<wire::SameHostTransport>(server_.get(), o);
    StartShard();
  }
  PsShard& shard() { return *shard_; }
  // Change before Restart() to run the shard with other options.
  PsShardOptions& options() { return options_; }
  wire::Sender Sender(int rank) const { return wire::Sender{wire::Role::Worker, rank, job_}; }
  // Connects one more peer, under `identity` (not a worker's): returns the
  // index Send and Next take for it.
  int AddPeer(const std::string& identity) {
    workers_.push_back(net_.NewTransport(identity));
    conns_.push_back(*workers_.back()->Connect("inproc://shard"));
    return static_cast<int>(workers_.size()) - 1;
  }

 private:
  void StartShard() {
    wire::Transport* transport =
        links_ ? static_cast<wire::Transport*>(links_.get()) : server_.get();
    auto shard = PsShard::Start(transport, options_, wire::Sender{wire::Role::Server, 0, job_});
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
  }

  uint64_t job_;
  PsShardOptions options_;
  wire::InProcNetwork net_;
  std::unique_ptr<wire::InProcTransport> server_;
  std::unique_ptr<wire::SameHostTransport> links_;  // over server_, when set
  std::unique_ptr<PsShard> shard_;
  std::vector<std::unique_ptr<wire::InProcTransport>> workers_;
  std::vector<wire::ConnId> conns_;
};

}  // namespace gradsync::server::testing

#endif  // GRADSYNC_PS_PS_SHARD_HARNESS_H_
