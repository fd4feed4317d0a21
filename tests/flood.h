// Hostile peers that flood a live job's listeners, for the multi-process
// tests: garbage over raw TCP, ZeroMQ peers sending 64 MiB frames, and
// peers that send forged requests and never read the answers.
#ifndef GRADSYNC_TESTS_FLOOD_H_
#define GRADSYNC_TESTS_FLOOD_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "wire/message.h"
#include "zmq.hpp"

namespace gradsync {

// The peak resident set (VmHWM) of process `pid` in MiB; -1 if unreadable.
inline double PeakRssMiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return -1;
}

// A TCP connection to "ip:port" (127.0.0.1 where the host is not a
// numeric address); -1 if refused.
inline int ConnectTo(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const size_t colon = address.rfind(':');
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(address.c_str() + colon + 1)));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// While a job trains: kGarbageSockets TCP connections spread over the
// targets, each sending garbage and then held open; ZeroMQ peers sending
// 64 MiB frames over and over; and at each target one ZeroMQ peer that
// sends forged pulls as fast as it may and never reads an answer.
class Flood {
 public:
  static constexpr int kGarbageSockets = 600;
  static constexpr int kHugePeersPerTarget = 12;
  static constexpr size_t kHugeFrame = size_t{64} << 20;

  Flood(std::vector<std::string> targets, uint64_t job)
      : targets_(std::move(targets)), job_(job), huge_(kHugeFrame, 0x5a) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Flood() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  uint64_t huge_sent() const { return huge_sent_.load(); }
  uint64_t forged_sent() const { return forged_sent_.load(); }
  int garbage_connected() const { return garbage_connected_; }

 private:
  void Run() {
    std::vector<int> fds;
    std::vector<char> garbage(4096);
    for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 131 + 7);
    for (int i = 0; i < kGarbageSockets; ++i) {
      const int fd = ConnectTo(targets_[static_cast<size_t>(i) % targets_.size()]);
      if (fd < 0) continue;
      ++garbage_connected_;
      (void)!write(fd, garbage.data(), garbage.size());
      fds.push_back(fd);
    }
    zmq::context_t ctx(1);
    std::thread never_reads([this, &ctx] { NeverRead(ctx); });
    std::vector<zmq::socket_t> huge;
    for (const std::string& t : targets_) {
      for (int i = 0; i < kHugePeersPerTarget; ++i) huge.push_back(Peer(ctx, t, 1 << 20));
    }
    while (!stop_.load()) {
      for (zmq::socket_t& s : huge) SendHuge(s);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    never_reads.join();
    for (int fd : fds) close(fd);
  }

  // One peer per target that sends forged pulls, each answered with an
  // Error, as fast as they are taken, and reads none of the answers.
  void NeverRead(zmq::context_t& ctx) {
    std::vector<zmq::socket_t> silent;
    for (const std::string& t : targets_) {
      silent.push_back(Peer(ctx, t, 1024));
      silent.back().set(zmq::sockopt::rcvhwm, 1);
      silent.back().set(zmq::sockopt::sndtimeo, 100);
    }
    while (!stop_.load()) {
      for (zmq::socket_t& s : silent) SendForgedPull(s);
    }
  }

  static zmq::socket_t Peer(zmq::context_t& ctx, const std::string& address, int buffer) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 2);
    s.set(zmq::sockopt::rcvbuf, buffer);
    s.set(zmq::sockopt::reconnect_ivl, 50);
    s.connect("tcp://" + address);
    return s;
  }

  void SendHuge(zmq::socket_t& s) {
    wire::DataFields f;
    f.num_elements = kHugeFrame / sizeof(float);
    f.round = 1;
    const wire::Message m =
        wire::MakeData(wire::Sender{wire::Role::Worker, 1, job_}, wire::MsgType::Push, f, {}, 1, 1);
    if (!s.send(zmq::buffer(m.header.data(), m.header.size()),
                zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      return;
    }
    s.send(zmq::message_t(huge_.data(), huge_.size(), nullptr, nullptr), zmq::send_flags::none);
    huge_sent_.fetch_add(1);
  }

  void SendForgedPull(zmq::socket_t& s) {
    wire::DataFields f;
    f.num_elements = 4;
    f.round = 1;
    const wire::Message m =
        wire::MakeData(wire::Sender{wire::Role::Worker, 0, job_}, wire::MsgType::Pull, f, {}, 1, 1);
    if (s.send(zmq::buffer(m.header.data(), m.header.size()), zmq::send_flags::none)) {
      forged_sent_.fetch_add(1);
    }
  }

  const std::vector<std::string> targets_;
  const uint64_t job_;
  std::vector<uint8_t> huge_;  // every 64 MiB frame, sent without a copy
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> huge_sent_{0}, forged_sent_{0};
  int garbage_connected_ = 0;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_FLOOD_H_
