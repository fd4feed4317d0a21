// The ZAP handler on real sockets: it keeps answering while signals
// interrupt its calls, a CURVE socket whose context has no handler refuses
// every client, and a handler whose context fails under it says so.
#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "gtest/gtest.h"
#include "wire/curve.h"
#include "wire/zmq_curve.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"

namespace gradsync::wire {
namespace {

void SetKey(zmq::socket_t& socket, int option, std::string_view z85) {
  ASSERT_EQ(zmq_setsockopt(socket.handle(), option, z85.data(), z85.size()), 0);
}

// A bare ZeroMQ CURVE client that knows the server's public key and holds
// the key pair `own`: connects to `endpoint` and sends one frame.
class RawClient {
 public:
  RawClient(const std::string& endpoint, const std::string& server_public, const CurveKey& own)
      : dealer_(context_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 0);
    SetKey(dealer_, ZMQ_CURVE_SERVERKEY, server_public);
    SetKey(dealer_, ZMQ_CURVE_PUBLICKEY, own.public_z85);
    SetKey(dealer_, ZMQ_CURVE_SECRETKEY, own.secret_z85);
    dealer_.connect(endpoint);
    dealer_.send(zmq::buffer(std::string("hello")), zmq::send_flags::dontwait);
  }

 private:
  zmq::context_t context_;
  zmq::socket_t dealer_;
};

// Whether a client holding `own` gets a frame through to `server`.
bool GetsIn(ZmqTransport& server, const std::string& endpoint, const CurveKey& job,
            const CurveKey& own) {
  RawClient client(endpoint, job.public_z85, own);
  return server.Receive(Deadline::AfterMs(2000)).ok();
}

void Ignore(int) {}

// Interrupts every other thread of this process with SIGUSR1 (handled
// without SA_RESTART, so blocking calls fail with EINTR), `rounds` times.
// The handler stays: a signal still pending afterwards must not end the
// process.
void InterruptEveryThread(int rounds) {
  struct sigaction action = {};
  action.sa_handler = Ignore;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &action, nullptr), 0);
  const long self = syscall(SYS_gettid);
  for (int i = 0; i < rounds; ++i) {
    DIR* tasks = opendir("/proc/self/task");
    ASSERT_NE(tasks, nullptr);
    while (dirent* e = readdir(tasks)) {
      const long tid = std::atol(e->d_name);
      if (tid > 0 && tid != self) syscall(SYS_tgkill, getpid(), tid, SIGUSR1);
    }
    closedir(tasks);
    usleep(1000);
  }
}

TEST(ZapHandlerTest, KeepsServingWhileSignalsInterruptIt) {
  const CurveKey job = *GenerateCurveKey();
  const CurveKey other = *GenerateCurveKey();
  ZmqOptions options;
  options.curve = job;
  auto server = std::move(ZmqTransport::Create(options)).value();
  const std::string endpoint = *server->Listen("tcp://127.0.0.1:0");
  // The handler waits in poll() 100 ms at a time: 400 rounds of signals,
  // 1 ms apart, interrupt it there several times.
  InterruptEveryThread(400);
  EXPECT_FALSE(GetsIn(*server, endpoint, job, other)) << "a client with another key got in";
  EXPECT_TRUE(GetsIn(*server, endpoint, job, job)) << "the job's own key was refused";
  EXPECT_GE(server->auth_failures(), 1u);
}

TEST(ZapHandlerTest, ACurveSocketWithoutAHandlerRefusesEveryone) {
  const CurveKey job = *GenerateCurveKey();
  zmq::context_t context;
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  ASSERT_TRUE(ApplyCurveServer(router, job).ok());
  router.bind("tcp://127.0.0.1:0");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  RawClient member(endpoint, job.public_z85, job);
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, std::chrono::milliseconds(2000));
  EXPECT_FALSE(item.revents & ZMQ_POLLIN) << "a client got in with no ZAP handler to admit it";
}

// A key the handler does not know yet waits, up to the hold, for it to be
// named: named in time, the client gets in under the User-Id it is bound to;
// named only after the hold, it was refused (and libzmq does not retry).
TEST(ZapHandlerTest, AnUnknownKeyIsHeldThenRefused) {
  const CurveKey server = *GenerateCurveKey();
  for (const int named_after_ms : {100, 1200}) {
    zmq::context_t context;
    std::atomic<bool> named{false};
    auto zap = ZapHandler::Start(
        context,
        [&named](const uint8_t*) {
          return named.load() ? std::optional<std::string>("node-1") : std::nullopt;
        },
        Millis(400), nullptr);
    ASSERT_TRUE(zap.ok()) << zap.status();
    zmq::socket_t router(context, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    ASSERT_TRUE(ApplyCurveServer(router, server).ok());
    router.bind("tcp://127.0.0.1:0");
    RawClient client(router.get(zmq::sockopt::last_endpoint), server.public_z85,
                     *GenerateCurveKey());
    std::this_thread::sleep_for(std::chrono::milliseconds(named_after_ms));
    named.store(true);
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(3000));
    if (named_after_ms > 400) {
      EXPECT_FALSE(item.revents & ZMQ_POLLIN) << "a key named after the hold got in";
      continue;
    }
    ASSERT_TRUE(item.revents & ZMQ_POLLIN) << "a key named within the hold was refused";
    zmq::message_t routing_id, body;
    ASSERT_TRUE(router.recv(routing_id));
    ASSERT_TRUE(router.recv(body));
    EXPECT_STREQ(body.gets("User-Id"), "node-1");
  }
}

TEST(ZapHandlerTest, AFailureIsReportedOnce) {
  const CurveKey job = *GenerateCurveKey();
  zmq::context_t context;
  std::promise<Status> failure;
  auto zap = ZapHandler::Start(context, job.public_z85,
                               [&failure](const Status& s) { failure.set_value(s); });
  ASSERT_TRUE(zap.ok()) << zap.status();
  EXPECT_FALSE((*zap)->failed());
  ASSERT_EQ(zmq_ctx_shutdown(context.handle()), 0);  // its socket fails with ETERM
  auto reported = failure.get_future();
  ASSERT_EQ(reported.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const Status s = reported.get();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("ZAP handler failed"), std::string::npos) << s;
  EXPECT_TRUE((*zap)->failed());
  zap->reset();
}

}  // namespace
}  // namespace gradsync::wire
