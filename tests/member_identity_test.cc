// A real CURVE job (scheduler, a synchronous shard with a server-side
// optimizer and a checkpoint_dir, 3 workers of tests/ps_worker), and a job
// member beside it: a process that holds the job's key and worker 1's own
// node key, as a member that turned hostile would. It tries to take other
// members' places: (1) it connects to the shard's stream port under worker
// 0's parameter-server identity to push as worker 0; (2) it
// connects to worker 0's data port as worker 2 (worker 0's left neighbour in
// the ring) and aborts the ring in its name; (3) it claims to be the shard
// restarted while the shard is silent, with its own key, then with the
// shard's public key, which it cannot prove it holds; (4) under its own
// identity, once the workers finished, it floods the shard (over a sealed
// stream of its own) with keys outside
// the job's plan. Each is refused and counted, the shard ends with the
// plan's keys only, and every worker ends with the parameters, bit for bit,
// of the same job without it. (A connection that finds another key than the
// peer's own at the peer's endpoint is wire/node_keys_test.cc's.)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <list>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "tests/flood.h"
#include "tests/job_metrics.h"
#include "tests/local_job.h"
#include "wire/curve.h"
#include "wire/message.h"
#include "wire/node_keys.h"
#include "wire/tcp_stream_transport.h"
#include "wire/validate.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace gradsync {
namespace {

constexpr int kWorkers = 3;
constexpr int kOpTimeoutMs = 30000;
constexpr int kForgedKeys = 500;

struct Peer {
  std::string address;   // host:data_port
  std::string identity;  // of its data transport
};

class MemberIdentityTest : public ::testing::Test, public LocalJob {
 protected:
  void SetUp() override {
    job_file_ = TmpFile("job.key");
    job_key_ = *wire::GenerateCurveKey();
    ASSERT_TRUE(wire::WriteKeyFile(job_file_, job_key_).ok());
    for (int r = 0; r < kWorkers; ++r) {
      worker_files_.push_back(TmpFile("worker" + std::to_string(r) + ".key"));
      worker_keys_.push_back(*wire::GenerateCurveKey());
      ASSERT_TRUE(wire::WriteKeyFile(worker_files_.back(), worker_keys_.back()).ok());
    }
  }

  // Each worker's "params H"; the member attacks when `attack`.
  std::vector<std::string> RunJob(const std::string& tag, bool attack) {
    tag_ = tag;
    // A loaded machine may stall a process for a second: 10 s of silence
    // before a node is declared dead.
    StartScheduler(kWorkers, 1,
                   {"--key_file=" + job_file_, "--metrics_port=0", "--server_grace_ms=60000",
                    "--missed_heartbeats=50"});
    SetJob(kWorkers, 1);
    env_["GRADSYNC_KEY_FILE"] = job_file_;
    checkpoint_dir_ = TmpFile(tag + ".checkpoints");
    shard_metrics_ = FreePort();
    shard_port_ = FreePort();
    Subprocess& shard = Start({Runfile("server/gradsync_server"), "--role=server", "--ps_mode=sync",
                               "--optimizer=momentum", "--lr=0.05", "--partition_bytes=262144",
                               "--checkpoint_dir=" + checkpoint_dir_, "--scheduler_grace_ms=60000",
                               "--data_port=" + std::to_string(shard_port_),
                               "--metrics_port=" + std::to_string(shard_metrics_)},
                              "server0");
    std::vector<Subprocess*> workers;
    for (int r = 0; r < kWorkers; ++r) {
      workers.push_back(&Start(
          {Runfile("tests/ps_worker"), "--rank=" + std::to_string(r), "--path=ps", "--mode=train",
           "--optimizer=momentum", "--steps=60", "--slow_ms=30", "--metrics_base_port=0",
           "--op_timeout_ms=" + std::to_string(kOpTimeoutMs), "--bucket_bytes=2097152",
           "--partition_bytes=262144", "--node_key_file=" + worker_files_[static_cast<size_t>(r)]},
          "worker" + std::to_string(r)));
    }
    if (attack) {
      ReadJob();
      PushAndPullAsWorker0(shard);
      AbortTheRingAsWorker2(*workers[0]);
      ClaimTheSilentShard(shard);
    }
    std::vector<std::string> params;
    for (int r = 0; r < kWorkers; ++r) {
      auto code = workers[static_cast<size_t>(r)]->Wait(Deadline::AfterMs(120000));
      const std::string out = workers[static_cast<size_t>(r)]->Output();
      EXPECT_TRUE(code.has_value() && *code == 0) << out;
      const std::string key = "worker " + std::to_string(r) + " params ";
      const size_t at = out.find(key);
      EXPECT_NE(at, std::string::npos) << out;
      params.push_back(at == std::string::npos ? "" : out.substr(at + key.size(), 16));
    }
    // Worker 1's key is worker 1: messages under it are worker 1's, and while
    // the honest worker 1 runs, the shard's answers follow whichever of the
    // two connections spoke last. A hostile worker 1 is the only process
    // with its key, so the flood comes once the honest one has finished.
    if (attack) FloodKeysOutsideThePlan(shard);
    scheduler_->Signal(SIGTERM);
    EXPECT_TRUE(shard.Wait(Deadline::AfterMs(30000)).has_value());
    std::smatch m;
    const std::string log = shard.Output();
    EXPECT_TRUE(
        std::regex_search(log, m, std::regex(R"(checkpoint written on exit[^:]*: (\d+) keys)")))
        << log;
    shard_keys_.push_back(m.empty() ? -1 : std::stoi(m[1].str()));
    scheduler_->Wait(Deadline::AfterMs(10000));
    nodes_.clear();
    sockets_.clear();
    return params;
  }

  // From the scheduler's log: the job id, the shard's and every worker's
  // data address and identity (by requested rank).
  void ReadJob() {
    ASSERT_TRUE(scheduler_->WaitForOutput("ready", Deadline::AfterMs(60000)))
        << scheduler_->Output();
    const std::string log = scheduler_->Output();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(job (\d+) assembled)")));
    job_ = std::strtoull(m[1].str().c_str(), nullptr, 10);
    const std::regex reg(R"(registered a (worker|server) \(pid \d+ on ([0-9.]+):(\d+)\)[^\n]*)"
                         R"(requested rank (-?\d+), data identity ([^)\s]+)\))");
    workers_.assign(kWorkers, Peer{});
    for (std::sregex_iterator it(log.begin(), log.end(), reg), end; it != end; ++it) {
      const Peer p{(*it)[2].str() + ":" + (*it)[3].str(), (*it)[5].str()};
      if ((*it)[1] == "server") {
        shard_ = p;
      } else {
        workers_.at(std::stoul((*it)[4].str())) = p;
      }
    }
    for (const Peer& p : workers_) ASSERT_FALSE(p.identity.empty()) << log;
    ASSERT_FALSE(shard_.identity.empty()) << log;
  }

  // A connection of the member's (worker 1's key pair) to `address`, which
  // serves with `server_key`, under ZeroMQ routing id `routing_id`; open
  // until the job ends.
  zmq::socket_t& Connect(const std::string& address, const std::string& server_key,
                         const std::string& routing_id) {
    sockets_.emplace_back(context_, zmq::socket_type::dealer);
    zmq::socket_t& s = sockets_.back();
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::routing_id, routing_id);
    s.set(zmq::sockopt::curve_serverkey, server_key);
    s.set(zmq::sockopt::curve_publickey, worker_keys_[1].public_z85);
    s.set(zmq::sockopt::curve_secretkey, worker_keys_[1].secret_z85);
    s.connect("tcp://" + address);
    return s;
  }

  static void SendOn(zmq::socket_t& s, const wire::Message& msg) {
    const bool more = !msg.payloads.empty();
    s.send(zmq::buffer(msg.header), more ? zmq::send_flags::sndmore : zmq::send_flags::none);
    for (size_t i = 0; i < msg.payloads.size(); ++i) {
      s.send(zmq::const_buffer(msg.payloads[i].data, msg.payloads[i].size),
             i + 1 < msg.payloads.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  wire::Message AsWorker(int32_t rank, wire::MsgType type, uint64_t round,
                         uint32_t bucket = 0) const {
    wire::DataFields f;
    f.bucket = bucket;
    f.num_elements = 4;
    f.round = round;
    std::vector<wire::Payload> payloads;
    if (type == wire::MsgType::Push)
      payloads.push_back(wire::Payload::Copy("0123456789abcdef", 16));
    return wire::MakeData(wire::Sender{wire::Role::Worker, rank, job_}, type, f,
                          std::move(payloads), round, round);
  }

  // The public key the shard serves with.
  std::string ShardKey() const {
    return wire::ReadKeyFile(checkpoint_dir_ + "/node-127.0.0.1-" + std::to_string(shard_port_) +
                             ".key")
        ->public_z85;
  }

  // The shard's stream endpoint ("tcp://host:port"), from its log.
  static std::string ShardStreams(const Subprocess& shard) {
    EXPECT_TRUE(shard.WaitForOutput("TCP streams at port", Deadline::AfterMs(30000)));
    std::smatch m;
    const std::string log = shard.Output();
    if (!std::regex_search(log, m, std::regex(R"(TCP streams at port (\d+))"))) return "";
    return "tcp://127.0.0.1:" + m[1].str();
  }

  // The member's sealed TCP streams (worker 1's node key) under `identity`,
  // with the plan every member has: itself and the shard, with their keys.
  std::unique_ptr<wire::TcpStreamTransport> MemberStreams(const std::string& identity,
                                                          const std::string& shard_streams) {
    auto node_info = [](const Peer& p, wire::Role role, int32_t rank, const std::string& key) {
      wire::NodeInfo n;
      n.role = role;
      n.rank = rank;
      n.identity = p.identity;
      n.host = p.address.substr(0, p.address.rfind(':'));
      n.data_port = static_cast<uint16_t>(std::stoi(p.address.substr(n.host.size() + 1)));
      n.public_key = key;
      return n;
    };
    wire::NodeInfo shard = node_info(shard_, wire::Role::Server, 0, ShardKey());
    shard.stream_port =
        static_cast<uint16_t>(std::stoi(shard_streams.substr(shard_streams.rfind(':') + 1)));
    auto keys = std::make_shared<wire::NodeKeys>(job_key_, worker_keys_[1]);
    keys->SetPlan(
        {node_info(workers_[1], wire::Role::Worker, 1, worker_keys_[1].public_z85), shard});
    wire::TcpStreamOptions o;
    o.job_id = job_;
    o.identity = identity;
    o.node_keys = std::move(keys);
    return std::make_unique<wire::TcpStreamTransport>(std::move(o));
  }

  // (1) At the shard's stream port, under worker 0's parameter-server
  // identity and under a lane of it: the handshake shows worker 1's key,
  // bound to another identity, and the shard refuses the connection
  // (counted in gradsync_auth_failures_total): nothing sent reaches it.
  void PushAndPullAsWorker0(const Subprocess& shard) {
    const std::string streams = ShardStreams(shard);
    ASSERT_FALSE(streams.empty()) << shard.Output();
    const double before = Sum(Scrape(shard_metrics_), "gradsync_auth_failures_total ");
    const std::string as = wire::PsClientIdentity(workers_[0].identity);
    for (const std::string& identity : {as, wire::LaneIdentity(as, 1)}) {
      auto t = MemberStreams(identity, streams);
      auto conn = t->Connect(streams);
      ASSERT_TRUE(conn.ok()) << conn.status();
      const Status sent = t->Send(wire::Route::Connection(*conn),
                                  AsWorker(0, wire::MsgType::Push, 1), Deadline::AfterMs(10000));
      EXPECT_FALSE(sent.ok()) << "the shard took a connection under " << identity;
      t->Shutdown();
    }
    double refused = 0;
    for (Deadline d = Deadline::AfterMs(20000); refused < 2 && !d.Expired();) {
      refused = Sum(Scrape(shard_metrics_), "gradsync_auth_failures_total ") - before;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_GE(refused, 2) << "the shard took a connection as worker 0 from another member";
  }

  // (4) Under its own parameter-server identity (worker 1's, a lane of its
  // own), over a sealed stream, once the workers finished: for each of
  // kForgedKeys keys outside the plan, a pull of its
  // initial parameters and a push of round 1. Each is answered Busy and
  // counted (early pulls, unplanned pushes); none may leave a key behind
  // (checked at the end of the job).
  void FloodKeysOutsideThePlan(const Subprocess& shard) {
    const std::string streams = ShardStreams(shard);
    ASSERT_FALSE(streams.empty()) << shard.Output();
    auto t =
        MemberStreams(wire::LaneIdentity(wire::PsClientIdentity(workers_[1].identity), 9), streams);
    auto conn = t->Connect(streams);
    ASSERT_TRUE(conn.ok()) << conn.status();
    auto waited = [&] {
      const std::string text = Scrape(shard_metrics_);
      return Sum(text, "gradsync_server_early_pulls_total ") +
             Sum(text, "gradsync_server_unplanned_pushes_total ");
    };
    const double before = waited();
    const double rss_before = PeakRssMiB(shard.pid());
    for (uint32_t i = 0; i < kForgedKeys; ++i) {
      for (wire::Message m : {AsWorker(1, wire::MsgType::Pull, 0, 1000 + i),
                              AsWorker(1, wire::MsgType::Push, 1, 1000 + i)}) {
        ASSERT_TRUE(
            t->Send(wire::Route::Connection(*conn), std::move(m), Deadline::AfterMs(10000)).ok());
      }
    }
    // The answers come back on the member's connection (it does not read
    // them): they are counted on the shard.
    double counted = 0;
    for (Deadline d = Deadline::AfterMs(20000); counted < 2 * kForgedKeys && !d.Expired();) {
      counted = waited() - before;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_GE(counted, 2 * kForgedKeys) << "keys outside the plan were taken\n" << shard.Output();
    const double rss_after = PeakRssMiB(shard.pid());  // the job's own keys grow it too
    std::printf(
        "shard peak RSS %.1f MiB before %d messages for keys outside the plan, "
        "%.1f MiB after\n",
        rss_before, 2 * kForgedKeys, rss_after);
  }

  // (2) Worker 0's left neighbour is worker 2.
  void AbortTheRingAsWorker2(const Subprocess& worker0) {
    zmq::socket_t& s = Connect(workers_[0].address, worker_keys_[0].public_z85,
                               workers_[2].identity + "#0123456789abcdef");
    wire::RingAbortFields abort;
    abort.origin_rank = 2;
    abort.blamed_rank = 0;
    abort.message = "forged";
    SendOn(s, wire::MakeRingAbort(wire::Sender{wire::Role::Worker, 2, job_}, abort));
    EXPECT_TRUE(worker0.WaitForOutput("refused a message under identity " + workers_[2].identity,
                                      Deadline::AfterMs(20000)))
        << worker0.Output();
  }

  // (3) Over the scheduler's port (the job key admits it), as server 0 at
  // the shard's address, once the shard has been silent for longer than a
  // restarted shard's claim waits.
  void ClaimTheSilentShard(Subprocess& shard) {
    wire::ZmqOptions o;
    o.curve = job_key_;
    auto t = std::move(wire::ZmqTransport::Create(o)).value();
    auto conn = t->Connect("tcp://" + address_);
    ASSERT_TRUE(conn.ok());
    wire::NodeInfo me;
    me.role = wire::Role::Server;
    me.rank = 0;
    me.host = shard_.address.substr(0, shard_.address.rfind(':'));
    me.data_port = static_cast<uint16_t>(std::stoi(shard_.address.substr(me.host.size() + 1)));
    me.identity = "member-claiming-server-0";
    shard.Signal(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(8 * kHeartbeatMs));
    // Its own key, proved (it holds worker 1's secret): not the shard's key.
    me.public_key = worker_keys_[1].public_z85;
    EXPECT_EQ(
        wire::ErrorCode::WrongKey,
        Claim(*t, *conn, me,
              wire::RegistrationProof(worker_keys_[1], wire::SchedulerPublicKey(job_key_), me)));
    EXPECT_TRUE(
        scheduler_->WaitForOutput("registered with another node key", Deadline::AfterMs(5000)));
    // The shard's own public key (every member knows it from the plan),
    // with a proof the member can make: under its own secret.
    auto shard_key = wire::ReadKeyFile(checkpoint_dir_ + "/node-" + me.host + "-" +
                                       std::to_string(me.data_port) + ".key");
    ASSERT_TRUE(shard_key.ok()) << shard_key.status();
    me.public_key = shard_key->public_z85;
    wire::CurveKey forged = worker_keys_[1];
    forged.public_z85 = shard_key->public_z85;
    EXPECT_EQ(wire::ErrorCode::WrongKey,
              Claim(*t, *conn, me,
                    wire::RegistrationProof(forged, wire::SchedulerPublicKey(job_key_), me)));
    EXPECT_TRUE(scheduler_->WaitForOutput("does not prove that the node holds the secret key",
                                          Deadline::AfterMs(5000)));
    shard.Signal(SIGCONT);
    t->Shutdown();
  }

  // Registers as `me` with `proof`; the scheduler's refusal (nullopt: none,
  // or a rank assignment, which fails the test).
  std::optional<wire::ErrorCode> Claim(wire::Transport& t, wire::ConnId conn,
                                       const wire::NodeInfo& me, const std::string& proof) {
    EXPECT_TRUE(t.Send(wire::Route::Connection(conn),
                       wire::MakeRegister(wire::Sender{wire::Role::Server, -1, 0}, me, kBuildId,
                                          static_cast<uint32_t>(getpid()), kProtocolVersion,
                                          kWorkers, 1, "", proof),
                       Deadline::AfterMs(5000))
                    .ok());
    std::optional<wire::ErrorCode> answer;
    bool assigned = false;
    for (Deadline d = Deadline::AfterMs(10000); !answer && !assigned && !d.Expired();) {
      auto in = t.Receive(d);
      if (!in.ok()) break;
      wire::Verdict v = wire::Validate(
          in->message,
          wire::Policy::Accepting({wire::MsgType::Error, wire::MsgType::RankAssignment}));
      if (!v.ok()) continue;
      assigned = v.type == wire::MsgType::RankAssignment;
      if (v.type == wire::MsgType::Error) answer = v.header->body_as_ErrorBody()->code();
    }
    EXPECT_FALSE(assigned) << "the scheduler gave the shard's place to " << me.public_key;
    return answer;
  }

  std::string job_file_;
  wire::CurveKey job_key_;
  std::vector<std::string> worker_files_;
  std::vector<wire::CurveKey> worker_keys_;
  std::string checkpoint_dir_;
  int shard_metrics_ = 0;
  int shard_port_ = 0;
  uint64_t job_ = 0;
  Peer shard_;
  std::vector<Peer> workers_;
  zmq::context_t context_;
  std::list<zmq::socket_t> sockets_;  // the member's connections
  std::vector<int> shard_keys_;       // per job: the keys its shard saved on exit
};

TEST_F(MemberIdentityTest, AMemberCannotTakeAnotherMembersPlace) {
  const std::vector<std::string> clean = RunJob("clean", false);
  const std::vector<std::string> attacked = RunJob("attacked", true);
  ASSERT_EQ(clean.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(attacked, clean);
  for (const std::string& p : clean) EXPECT_EQ(p, clean[0]);
  ASSERT_EQ(shard_keys_.size(), 2u);
  EXPECT_GT(shard_keys_[0], 0);
  EXPECT_EQ(shard_keys_[1], shard_keys_[0]) << "the shard kept keys outside the plan";
  std::printf("params %s, with the member's attempts and without; shard keys %d and %d\n",
              clean[0].c_str(), shard_keys_[1], shard_keys_[0]);
}

}  // namespace
}  // namespace gradsync
