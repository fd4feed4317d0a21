// A real job (scheduler, 2 synchronous shards with a server-side optimizer,
// 4 workers of tests/ps_worker) with a forger beside it that knows the job
// id and the addresses: it sends each message a hostile peer was found to
// hurt the job with. The job must finish with every worker exit 0 and the
// same parameters, bit for bit, as the same job without the forger, and
// every forged message must be refused and counted in
// gradsync_messages_rejected_total. A flood run (tests/flood.h) holds the
// job to its operation deadlines and the servers' peak RSS to a bound.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
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
#include "wire/tcp_stream_transport.h"
#include "wire/validate.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"

namespace gradsync {
namespace {

constexpr int kWorkers = 4;
constexpr int kServers = 2;
// Every worker operation must end within this; a worker whose operation
// does not exits non-zero.
constexpr int kOpTimeoutMs = 30000;
constexpr int kFloodSteps = 100;

double Rejected(const std::string& exposition) {
  return Sum(exposition, "gradsync_messages_rejected_total{");
}

double AuthFailures(const std::string& exposition) {
  return Sum(exposition, "gradsync_auth_failures_total ");
}

enum class Attack { kNone, kForge, kFlood, kMultipart };

// Every TCP port process `pid` listens on (IPv4), with its address
// ("127.0.0.1:port"; a wildcard address as 127.0.0.1).
std::vector<std::string> ListeningAddresses(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* dir = opendir(fds.c_str())) {
    while (dirent* e = readdir(dir)) {
      char link[128];
      const ssize_t n = readlink((fds + "/" + e->d_name).c_str(), link, sizeof(link) - 1);
      if (n <= 0) continue;
      const std::string target(link, static_cast<size_t>(n));
      if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
    closedir(dir);
  }
  std::vector<std::string> out;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the column names
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
        inode;
    if (state != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
    const uint32_t ip = static_cast<uint32_t>(std::stoul(local.substr(0, 8), nullptr, 16));
    const int port = std::stoi(local.substr(9), nullptr, 16);
    char host[INET_ADDRSTRLEN] = "127.0.0.1";
    if (ip != 0) {
      in_addr a{};
      a.s_addr = ip;  // as the kernel prints it: network order, read as a host word
      inet_ntop(AF_INET, &a, host, sizeof(host));
    }
    out.push_back(std::string(host) + ":" + std::to_string(port));
  }
  return out;
}

// A stranger with no key at `address`: a ZeroMQ greeting (ZMTP 3.0, the
// NULL mechanism) and a READY, then 64 KiB frames that each say another
// follows (the MORE flag), never the last, over and over; on a closed
// connection it connects again. libzmq holds every frame of a multipart
// message until its last, so a socket that takes a stranger's frames grows
// by all of them. Stops at `stop` or after kMultipartBytes.
constexpr uint64_t kMultipartBytes = uint64_t{64} << 20;
void EndlessMultipart(const std::string& address, const std::atomic<bool>& stop,
                      std::atomic<uint64_t>& sent) {
  std::string hello(64, '\0');
  hello[0] = '\xff';
  hello[9] = '\x7f';
  hello[10] = 3;  // ZMTP 3.0
  std::memcpy(&hello[12], "NULL", 4);
  const std::string body =
      std::string("\x05READY\x0bSocket-Type") + std::string("\0\0\0\x06", 4) + "DEALER";
  hello += std::string("\x04") + static_cast<char>(body.size()) + body;
  std::string frame(9 + 65536, 'x');
  frame[0] = 0x03;  // MORE | LONG
  const uint64_t size = 65536;
  for (int b = 0; b < 8; ++b) frame[1 + b] = static_cast<char>(size >> (8 * (7 - b)));
  uint64_t mine = 0;
  while (!stop.load() && mine < kMultipartBytes) {
    const int fd = ConnectTo(address);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    timeval t{0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t));
    bool open =
        send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size());
    while (open && !stop.load() && mine < kMultipartBytes) {
      const ssize_t n = send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
      if (n > 0) mine += static_cast<uint64_t>(n);
      open = n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
      if (n < 0 && open) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  sent += mine;
}

class HostilePeerTest : public ::testing::Test, public LocalJob {
 protected:
  struct Result {
    std::vector<std::string> params;          // each worker's "params H"
    double rejected = 0;                      // by the shards and the scheduler
    double auth_failures = 0;                 // refused handshakes, same processes
    std::vector<double> peak_rss_mib;         // VmHWM: the scheduler, then each shard
    std::vector<double> worker_peak_rss_mib;  // VmHWM: each worker
  };

  // With CURVE: a peer with no key, one with another job's key, and one
  // speaking plain TCP bytes (a registration sent in the clear) try the
  // scheduler and both shards; none gets a message through.
  void ForgeWithoutTheKey() {
    const wire::CurveKey other = *wire::GenerateCurveKey();
    std::vector<std::string> targets = servers_;
    targets.push_back(address_);
    for (const std::string& address : targets) {
      for (auto key : {std::optional<wire::CurveKey>(), std::optional<wire::CurveKey>(other)}) {
        wire::ZmqOptions o;
        o.curve = key;
        auto t = std::move(wire::ZmqTransport::Create(o)).value();
        EXPECT_FALSE(t->Probe("tcp://" + address, Deadline::AfterMs(3000)).ok())
            << address << " let a peer " << (key ? "with another job's key" : "without a key")
            << " in";
        t->Shutdown();
      }
    }
    wire::NodeInfo me;
    me.role = wire::Role::Worker;
    me.host = "127.0.0.1";
    const wire::Message reg =
        wire::MakeRegister(wire::Sender{wire::Role::Worker, -1, 0}, me, kBuildId, 4242,
                           kProtocolVersion, kWorkers, kServers);
    SendRaw(address_, std::string(reg.header.begin(), reg.header.end()));
  }

  // Opens a TCP connection to `address`, writes `bytes`, closes it.
  static void SendRaw(const std::string& address, const std::string& bytes) {
    const int fd = ConnectTo(address);
    if (fd < 0) return;
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    close(fd);
  }

  // `key_file`: the job runs CURVE with it ("": not).
  // `two_hosts`: half the workers on 127.0.0.2 (another host to the plan:
  // the ring between the hosts runs over TCP streams).
  Result RunJob(const std::string& tag, Attack attack, const std::string& key_file = "",
                int steps = 25, bool two_hosts = false) {
    const bool forge = attack == Attack::kForge;
    tag_ = tag;
    const int scheduler_metrics = FreePort();
    std::vector<std::string> flags = {"--metrics_port=" + std::to_string(scheduler_metrics)};
    if (!key_file.empty()) flags.push_back("--key_file=" + key_file);
    StartScheduler(kWorkers, kServers, flags);
    SetJob(kWorkers, kServers);
    if (!key_file.empty()) env_["GRADSYNC_KEY_FILE"] = key_file;
    std::vector<int> shard_metrics;
    for (int s = 0; s < kServers; ++s) {
      shard_metrics.push_back(FreePort());
      Start({Runfile("server/gradsync_server"), "--role=server", "--ps_mode=sync",
             "--optimizer=momentum", "--lr=0.05", "--partition_bytes=262144",
             "--metrics_port=" + std::to_string(shard_metrics.back())},
            "server" + std::to_string(s));
    }
    std::vector<Subprocess*> workers;
    for (int r = 0; r < kWorkers; ++r) {
      workers.push_back(&Start(
          {Runfile("tests/ps_worker"), "--rank=" + std::to_string(r), "--path=ps", "--mode=train",
           "--optimizer=momentum", "--steps=" + std::to_string(steps), "--slow_ms=20",
           "--metrics_base_port=0", "--op_timeout_ms=" + std::to_string(kOpTimeoutMs),
           "--bucket_bytes=2097152", "--partition_bytes=262144",
           std::string("--host=") + (two_hosts && r >= kWorkers / 2 ? "127.0.0.2" : "127.0.0.1")},
          "worker" + std::to_string(r)));
    }
    Result result;
    // The peak resident sets, sampled while the job runs: the scheduler and
    // the shards exit with the job, and a process gone has none to read.
    std::vector<double> peaks(static_cast<size_t>(kServers) + 1, -1);
    std::vector<double> worker_peaks(static_cast<size_t>(kWorkers), -1);
    std::atomic<bool> sampling{true};
    auto sample = [&] {
      peaks[0] = std::max(peaks[0], PeakRssMiB(scheduler_->pid()));
      for (int s = 0; s < kServers; ++s) {
        double& peak = peaks[static_cast<size_t>(s) + 1];
        peak = std::max(peak, PeakRssMiB(nodes_[s]->pid()));
      }
      for (int r = 0; r < kWorkers; ++r) {
        double& peak = worker_peaks[static_cast<size_t>(r)];
        peak = std::max(peak, PeakRssMiB(workers[r]->pid()));
      }
    };
    std::thread sampler([&] {
      while (sampling.load()) {
        sample();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    std::unique_ptr<Flood> flood;
    std::atomic<bool> stop_multipart{false};
    std::atomic<uint64_t> multipart_sent{0};
    std::vector<std::thread> multipart;
    if (attack == Attack::kMultipart) {
      // Every port of every process of the job, once every worker's
      // communicator is up (its lanes and streams listen).
      ReadJob();
      for (int r = 0; r < kWorkers; ++r) {
        EXPECT_TRUE(workers[r]->WaitForOutput("joined, backend", Deadline::AfterMs(60000)))
            << workers[r]->Output();
      }
      std::vector<pid_t> pids = {scheduler_->pid()};
      for (const auto& node : nodes_) pids.push_back(node->pid());
      for (pid_t pid : pids) {
        for (const std::string& address : ListeningAddresses(pid)) {
          ports_attacked_.push_back(address);
          multipart.emplace_back(
              [&, address] { EndlessMultipart(address, stop_multipart, multipart_sent); });
        }
      }
    } else if (attack == Attack::kFlood) {
      ReadJob();
      std::vector<std::string> targets = servers_;
      targets.push_back(address_);
      flood = std::make_unique<Flood>(targets, job_);
    } else if (forge && !key_file.empty()) {
      ReadJob();
      ForgeWithoutTheKey();
      for (Deadline d = Deadline::AfterMs(20000); !d.Expired();) {
        double sum = AuthFailures(Scrape(scheduler_metrics));
        for (int port : shard_metrics) sum += AuthFailures(Scrape(port));
        result.auth_failures = std::max(result.auth_failures, sum);
        if (result.auth_failures >= 6) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } else if (forge) {
      Forge();
      // The shards leave when the workers do: read their counters now, once
      // every refusal the forger saw is counted (or the time is up).
      for (Deadline d = Deadline::AfterMs(20000); !d.Expired();) {
        double sum = Rejected(Scrape(scheduler_metrics));
        for (int port : shard_metrics) sum += Rejected(Scrape(port));
        result.rejected = std::max(result.rejected, sum);
        if (result.rejected >= refused_) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    for (int r = 0; r < kWorkers; ++r) {
      auto code = workers[r]->Wait(Deadline::AfterMs(120000));
      EXPECT_TRUE(code.has_value()) << "worker still running:\n" << workers[r]->Output();
      if (code) {
        EXPECT_EQ(*code, 0) << workers[r]->Output();
      }
      const std::string out = workers[r]->Output();
      const std::string key = "worker " + std::to_string(r) + " params ";
      const size_t at = out.find(key);
      EXPECT_NE(at, std::string::npos) << out;
      if (at != std::string::npos) result.params.push_back(out.substr(at + key.size(), 16));
    }
    stop_multipart = true;
    for (std::thread& t : multipart) t.join();
    multipart_sent_ = multipart_sent.load();
    if (flood) {
      flood->Stop();
      EXPECT_EQ(flood->garbage_connected(), Flood::kGarbageSockets);
      EXPECT_GT(flood->huge_sent(), 0u);
      EXPECT_GT(flood->forged_sent(), 0u);
      std::printf(
          "flood: %d garbage connections, %llu frames of 64 MiB, %llu forged pulls "
          "never read\n",
          flood->garbage_connected(), static_cast<unsigned long long>(flood->huge_sent()),
          static_cast<unsigned long long>(flood->forged_sent()));
    }
    sampling.store(false);
    sampler.join();
    sample();  // the last word of those still there
    result.peak_rss_mib = peaks;
    result.worker_peak_rss_mib = worker_peaks;
    std::printf("%s: peak RSS (VmHWM) scheduler %.1f MiB", tag.c_str(), result.peak_rss_mib[0]);
    for (int s = 0; s < kServers; ++s) {
      std::printf(", server%d %.1f MiB", s, result.peak_rss_mib[static_cast<size_t>(s) + 1]);
    }
    for (int r = 0; r < kWorkers; ++r) {
      std::printf(", worker%d %.1f MiB", r, worker_peaks[static_cast<size_t>(r)]);
    }
    std::printf("\n");
    std::fflush(stdout);
    scheduler_->Signal(SIGTERM);
    for (int s = 0; s < kServers; ++s) {
      EXPECT_TRUE(nodes_[s]->Wait(Deadline::AfterMs(30000)).has_value());
    }
    scheduler_->Wait(Deadline::AfterMs(10000));
    nodes_.clear();
    return result;
  }

  // From the scheduler's log: the job id and every node's data address.
  void ReadJob(size_t workers = kWorkers, size_t servers = kServers) {
    ASSERT_TRUE(scheduler_->WaitForOutput("ready", Deadline::AfterMs(30000)))
        << scheduler_->Output();
    const std::string log = scheduler_->Output();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(job (\d+) assembled)")));
    job_ = std::strtoull(m[1].str().c_str(), nullptr, 10);
    const std::regex reg(R"(registered a (worker|server) \(pid \d+ on ([0-9.]+):(\d+)\))");
    servers_.clear();
    workers_.clear();
    for (std::sregex_iterator it(log.begin(), log.end(), reg), end; it != end; ++it) {
      const std::string address = (*it)[2].str() + ":" + (*it)[3].str();
      ((*it)[1] == "server" ? servers_ : workers_).push_back(address);
    }
    ASSERT_EQ(servers_.size(), servers) << log;
    ASSERT_EQ(workers_.size(), workers) << log;
  }

  // Sends `msg` to `address` and expects an Error back: a refusal (counted
  // in refused_), or Busy, "send it again" (counted in busy_).
  void ExpectRefused(wire::Transport& t, const std::string& address, wire::Message msg,
                     const std::string& what) {
    auto conn = t.Connect("tcp://" + address);
    ASSERT_TRUE(conn.ok()) << conn.status();
    ASSERT_TRUE(
        t.Send(wire::Route::Connection(*conn), std::move(msg), Deadline::AfterMs(5000)).ok());
    for (Deadline d = Deadline::AfterMs(15000); !d.Expired();) {
      auto in = t.Receive(d);
      if (!in.ok()) break;
      wire::Verdict v = wire::Validate(
          in->message, wire::Policy::Accepting(
                           {wire::MsgType::Error, wire::MsgType::Ack, wire::MsgType::Reply}));
      if (v.ok() && v.type == wire::MsgType::Error) {
        ++(v.header->body_as_ErrorBody()->code() == wire::ErrorCode::Busy ? busy_ : refused_);
        return;
      }
    }
    ADD_FAILURE() << what << " was not refused";
  }

  wire::Message Push(int as_worker, uint32_t partition, uint64_t round, uint64_t elements,
                     const std::string& codec, size_t bytes) {
    std::vector<uint8_t> junk(bytes, 0x41);
    wire::DataFields f;
    f.partition = partition;
    f.num_elements = elements;
    f.round = round;
    f.codec = codec;
    return wire::MakeData(wire::Sender{wire::Role::Worker, as_worker, job_}, wire::MsgType::Push, f,
                          {wire::Payload::Copy(junk.data(), junk.size())}, round, round);
  }

  // From the nodes' logs: each worker's identity, by rank, and each shard's
  // stream port ("host:port"), by rank.
  void ReadIdentities() {
    worker_identities_.assign(kWorkers, "");
    shard_streams_.assign(kServers, "");
    for (const auto& node : nodes_) {
      const std::string out = node->Output();
      std::smatch m;
      if (std::regex_search(out, m, std::regex(R"(as worker (\d+) \(identity ([^,]+),)"))) {
        worker_identities_.at(std::stoul(m[1].str())) = m[2].str();
      } else if (std::regex_search(out, m, std::regex(R"(as server (\d+) )"))) {
        const size_t rank = std::stoul(m[1].str());
        std::smatch p;
        ASSERT_TRUE(std::regex_search(out, p, std::regex(R"(TCP streams at port (\d+))"))) << out;
        shard_streams_.at(rank) = "127.0.0.1:" + p[1].str();
      }
    }
  }

  // A forger's connection to the shards' stream ports under a lane of
  // worker `rank`'s parameter-server client (a job without CURVE checks no
  // key: anyone who learns an identity may claim it).
  std::unique_ptr<wire::TcpStreamTransport> AsWorker(int rank) {
    wire::TcpStreamOptions o;
    o.job_id = job_;
    o.identity = wire::LaneIdentity(
        wire::PsClientIdentity(worker_identities_.at(static_cast<size_t>(rank))), 9);
    return std::make_unique<wire::TcpStreamTransport>(std::move(o));
  }

  void Forge() {
    ReadJob();
    for (const auto& node : nodes_) {
      ASSERT_TRUE(node->WaitForOutput("joined job", Deadline::AfterMs(30000))) << node->Output();
    }
    ReadIdentities();
    auto t = std::move(wire::ZmqTransport::Create({})).value();
    for (const std::string& data_port : servers_) {
      ExpectRefused(*t, data_port, Push(1, 0, 1, 4, "", 16),
                    "a push to a shard's data port (a shard takes pushes at its stream port)");
    }
    for (const std::string& shard : shard_streams_) {
      // Seen live: ended a shard with std::bad_alloc.
      ExpectRefused(*AsWorker(1), shard, Push(1, 0, 1, uint64_t{1} << 40, "topk:ratio=0.01", 64),
                    "a 2^40-element top-k push");
      // A closed round, impersonating a worker, over another connection.
      ExpectRefused(*AsWorker(2), shard, Push(2, 0, 1, 4, "", 16), "a push for a closed round");
      // A pull under worker 0's identity, which a job without CURVE cannot
      // tell from worker 0's: of a key nobody pushed yet, it is told to
      // push first (Busy), as worker 0 would be.
      wire::DataFields pull;
      pull.num_elements = 4;
      pull.round = 3;
      ExpectRefused(*AsWorker(0), shard,
                    wire::MakeData(wire::Sender{wire::Role::Worker, 0, job_}, wire::MsgType::Pull,
                                   pull, {}, 3, 3),
                    "a forged pull");
      ExpectRefused(*AsWorker(3), shard, Push(3, 0, 2, 1, "", 4096),
                    "a push whose payload disagrees with its element count");
    }
    // A ring message of another type with a short payload, to each worker.
    for (size_t r = 0; r < workers_.size(); ++r) {
      wire::RingDataFields f;
      f.dtype = wire::DType::U8;
      f.num_elements = 8;
      std::vector<uint8_t> bytes(8, 0x7f);
      const int left = static_cast<int>((r + kWorkers - 1) % kWorkers);
      auto conn = t->Connect("tcp://" + workers_[r]);
      ASSERT_TRUE(conn.ok());
      ASSERT_TRUE(
          t->Send(wire::Route::Connection(*conn),
                  wire::MakeRingData(wire::Sender{wire::Role::Worker, left, job_}, f,
                                     {wire::Payload::Copy(bytes.data(), bytes.size())}, 0, 0),
                  Deadline::AfterMs(5000))
              .ok());
    }
    // A registration claiming a live shard's address.
    wire::NodeInfo claim;
    claim.role = wire::Role::Server;
    claim.rank = 0;
    const size_t colon = servers_[0].rfind(':');
    claim.host = servers_[0].substr(0, colon);
    claim.data_port = static_cast<uint16_t>(std::atoi(servers_[0].c_str() + colon + 1));
    ExpectRefused(*t, address_,
                  wire::MakeRegister(wire::Sender{wire::Role::Server, 0, 0}, claim, kBuildId, 4242,
                                     kProtocolVersion, kWorkers, kServers),
                  "a registration claiming a live shard's address");
    t->Shutdown();
  }

  // Sends garbage to `address` as fast as it is taken until `stop`, and
  // never reads the answers: a raw socket whose receive queue and kernel
  // buffer hold almost nothing, so the answers back up.
  static void FloodRingEndpoint(const std::string& address, const std::atomic<bool>& stop,
                                std::atomic<uint64_t>& sent) {
    // Outlives the context: its I/O thread sends the frame without a copy.
    const std::vector<uint8_t> frame(size_t{64} << 20, 0x5a);
    zmq::context_t context(1);
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::rcvhwm, 1);
    dealer.set(zmq::sockopt::rcvbuf, 4096);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect("tcp://" + address);
    // And a peer sending 64 MiB frames: a worker takes no frame larger than
    // the ring's largest message, so none is ever held whole.
    zmq::socket_t huge(context, zmq::socket_type::dealer);
    huge.set(zmq::sockopt::linger, 0);
    huge.set(zmq::sockopt::sndhwm, 2);
    huge.set(zmq::sockopt::reconnect_ivl, 50);
    huge.connect("tcp://" + address);
    const std::string garbage(48, '\x5a');
    while (!stop) {
      huge.send(zmq::message_t(const_cast<uint8_t*>(frame.data()), frame.size(), nullptr, nullptr),
                zmq::send_flags::dontwait);
      zmq::pollitem_t out{dealer.handle(), 0, ZMQ_POLLOUT, 0};
      if (zmq::poll(&out, 1, std::chrono::milliseconds(20)) == 0) continue;
      if (dealer.send(zmq::buffer(garbage), zmq::send_flags::dontwait)) ++sent;
    }
  }

  uint64_t job_ = 0;
  std::vector<std::string> servers_, workers_;
  int refused_ = 0;
  int busy_ = 0;
  std::vector<std::string> worker_identities_, shard_streams_;  // ReadIdentities
  std::vector<std::string> ports_attacked_;                     // Attack::kMultipart's targets
  uint64_t multipart_sent_ = 0;                                 // what they took of it
};

TEST_F(HostilePeerTest, TheJobFinishesBitEqualAndEveryForgedMessageIsRefusedAndCounted) {
  const Result clean = RunJob("clean", Attack::kNone);
  const Result attacked = RunJob("forged", Attack::kForge);
  ASSERT_EQ(clean.params.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(attacked.params, clean.params);
  EXPECT_EQ(refused_, 4 * kServers + 1);
  EXPECT_EQ(busy_, kServers);
  // Every refusal the forger saw, plus none unaccounted for on the shards
  // and the scheduler (the workers' ring refusals are their own metric).
  EXPECT_GE(attacked.rejected, refused_);
}

// With CURVE, peers without the job's key do not get a message in: every
// attempt is refused at the handshake and counted in
// gradsync_auth_failures_total, and the job ends as it does without them.
TEST_F(HostilePeerTest, WithCurveOnlyTheJobsKeyGetsInAndTheJobIsUnaffected) {
  const std::string key_file = TmpFile("job.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  const Result clean = RunJob("clean", Attack::kNone);
  const Result attacked = RunJob("curve", Attack::kForge, key_file);
  ASSERT_EQ(clean.params.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(attacked.params, clean.params);
  EXPECT_GE(attacked.auth_failures, 6);  // two peers at each of three listeners
}

// A peer that floods every ring endpoint with garbage at full speed and
// never reads its answers (seen live: a 256 KiB all-reduce held 192 s
// against a 10 s deadline: each refusal was a blocking send, and the
// deadline was checked only when nothing arrived for a poll interval).
// While the ring is whole every all-reduce succeeds with the right sum;
// once rank 1 stops contributing, ranks 0 and 2 fail naming it by their
// deadline, the flood notwithstanding. 64 MiB frames sent to the ring
// endpoints meanwhile are refused unread (the ring's largest frame bounds
// them).
TEST_F(HostilePeerTest, AGarbageFloodFromAPeerThatNeverReadsHoldsNoAllReducePastItsDeadline) {
  constexpr int kRing = 3, kOps = 40, kStall = 30, kDeadlineMs = 3000, kSlackMs = 2000;
  tag_ = "flood";
  StartScheduler(kRing, 0);
  SetJob(kRing, 0);
  const std::string go = TmpFile("flood.go");
  std::vector<Subprocess*> workers;
  for (int r = 0; r < kRing; ++r) {
    workers.push_back(
        &Start({Runfile("tests/sdk_worker"), "--rank=" + std::to_string(r), "--mode=direct",
                "--steps=" + std::to_string(kOps), "--victim=1",
                "--victim_step=" + std::to_string(kStall), "--go_file=" + go,
                "--metrics_base_port=0", "--op_timeout_ms=" + std::to_string(kDeadlineMs)},
               "worker" + std::to_string(r)));
  }
  ReadJob(kRing, 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0};
  std::vector<std::thread> flooders;
  for (const std::string& w : workers_) {
    flooders.emplace_back([&, w] { FloodRingEndpoint(w, stop, sent); });
  }
  // Every worker has a backlog of garbage before its first all-reduce.
  for (Deadline d = Deadline::AfterMs(30000); !d.Expired() && sent < 3000u * kRing;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(sent.load(), 3000u * kRing);
  { std::ofstream(go) << "go"; }
  for (int r : {0, 2}) {
    auto code = workers[r]->Wait(Deadline::AfterMs(60000));
    EXPECT_TRUE(code.has_value()) << "worker " << r << " is still held:\n" << workers[r]->Output();
    if (code) {
      EXPECT_EQ(*code, 3) << workers[r]->Output();
    }
    const std::string out = workers[r]->Output();
    const std::regex took(R"(allreduce (\d+) took (\d+) ms: (\w+))");
    int ops = 0;
    for (std::sregex_iterator it(out.begin(), out.end(), took), end; it != end; ++it, ++ops) {
      const bool last = std::atoi((*it)[1].str().c_str()) == kStall;
      EXPECT_EQ((*it)[3].str(), last ? "deadline_exceeded" : "ok") << out;
      EXPECT_LT(std::atol((*it)[2].str().c_str()), kDeadlineMs + (last ? kSlackMs : 0)) << out;
    }
    EXPECT_EQ(ops, kStall + 1) << out;
    EXPECT_NE(out.find("rank 1 stopped contributing"), std::string::npos) << out;
  }
  stop = true;
  for (std::thread& f : flooders) f.join();
  const double rss = PeakRssMiB(workers[1]->pid());
  std::printf("flooded worker 1: peak RSS (VmHWM) %.1f MiB\n", rss);
  EXPECT_GT(rss, 0);
  EXPECT_LT(rss, 64) << "worker 1 held a 64 MiB frame whole";
  workers[1]->Signal(SIGKILL);
  scheduler_->Signal(SIGTERM);
  scheduler_->Wait(Deadline::AfterMs(10000));
}

// A garbage-and-flood run: 600 connections of garbage, 64 MiB frames and a
// peer at each listener that never reads, all through the job. Every worker
// operation ends within its deadline, the job's result is bit-equal to the
// same job without the flood, and no server process buffers the flood:
// their peak resident sets stay far below what one round of 64 MiB frames
// would take.
TEST_F(HostilePeerTest, AFloodOfGarbageHugeFramesAndAPeerThatNeverReadsLeavesTheJobWhole) {
  // Long enough for the answers the silent peers never read to back up
  // into the servers' send queues.
  const Result clean = RunJob("clean", Attack::kNone, "", kFloodSteps);
  const Result flooded = RunJob("flood", Attack::kFlood, "", kFloodSteps);
  ASSERT_EQ(clean.params.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(flooded.params, clean.params);
  ASSERT_EQ(flooded.peak_rss_mib.size(), static_cast<size_t>(kServers) + 1);
  ASSERT_EQ(clean.peak_rss_mib.size(), flooded.peak_rss_mib.size());
  for (size_t p = 0; p < flooded.peak_rss_mib.size(); ++p) {
    const double mib = flooded.peak_rss_mib[p];
    EXPECT_GT(mib, 0);
    EXPECT_LT(mib, 512) << "a server process buffered the flood";
    // Not one 64 MiB frame was held whole.
    EXPECT_LT(mib - clean.peak_rss_mib[p], 64) << "process " << p << " (0: the scheduler)";
  }
}

// A stranger with no key sends endless multipart messages (every frame
// "more follows") to every port every process of a CURVE job listens on:
// the scheduler's, the shards' data and stream ports, the workers' data
// ports, their ring lanes' streams between two hosts, the metrics ports.
// No socket a stranger reaches takes a frame before a handshake, so no
// process grows past the same job's without the stranger, and the job ends
// bit-equal.
TEST_F(HostilePeerTest, EndlessMultipartMessagesToEveryPortGrowNoProcess) {
  const std::string key_file = TmpFile("multipart.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  const Result clean = RunJob("clean", Attack::kNone, key_file, 25, /*two_hosts=*/true);
  const Result attacked = RunJob("multipart", Attack::kMultipart, key_file, 25, true);
  ASSERT_EQ(clean.params.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(attacked.params, clean.params);
  // The scheduler, 2 shards (data, stream), 4 workers (data, 1 lane each
  // at least): 11 ports or more, besides the metrics ports.
  EXPECT_GE(ports_attacked_.size(), 11u);
  EXPECT_GT(multipart_sent_, 0u);
  std::printf("multipart: %zu ports, %.1f MiB written to them\n", ports_attacked_.size(),
              static_cast<double>(multipart_sent_) / (1 << 20));
  auto check = [](const std::vector<double>& before, const std::vector<double>& after,
                  const std::string& who) {
    ASSERT_EQ(before.size(), after.size());
    for (size_t p = 0; p < after.size(); ++p) {
      EXPECT_GT(after[p], 0) << who << " " << p;
      EXPECT_LT(after[p] - before[p], 32) << who << " " << p << " took a stranger's frames";
    }
  };
  check(clean.peak_rss_mib, attacked.peak_rss_mib, "scheduler (0) or shard (1+)");
  check(clean.worker_peak_rss_mib, attacked.worker_peak_rss_mib, "worker");
}

}  // namespace
}  // namespace gradsync
