#include "scheduler/embedded_scheduler.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "wire/zmq_transport.h"

namespace gradsync::server {

StatusOr<std::unique_ptr<EmbeddedScheduler>> EmbeddedScheduler::Start(const Config& config) {
  GS_ASSIGN_OR_RETURN(SchedulerOptions options, SchedulerOptions::FromConfig(config));
  wire::ZmqOptions zmq;
  zmq.identity = "scheduler";
  zmq.curve = options.curve;
  zmq.max_frame_bytes = wire::Limits{}.max_header_bytes;  // control messages only
  GS_ASSIGN_OR_RETURN(std::unique_ptr<wire::ZmqTransport> transport,
                      wire::ZmqTransport::Create(zmq));
  std::unique_ptr<EmbeddedScheduler> s(new EmbeddedScheduler());
  s->scheduler_ = std::make_unique<Scheduler>(std::move(options), std::move(transport),
                                              /*metrics=*/nullptr, &s->clock_);
  GS_ASSIGN_OR_RETURN(std::string bound, s->scheduler_->Start());
  // "tcp://HOST:PORT"
  s->port_ = std::atoi(bound.c_str() + bound.rfind(':') + 1);
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

EmbeddedScheduler::~EmbeddedScheduler() { (void)Stop(Deadline::Past()); }

void EmbeddedScheduler::Serve() {
  Status result = scheduler_->Run(stop_);
  std::lock_guard<std::mutex> lock(mu_);
  result_ = std::move(result);
  done_ = true;
  ended_.notify_all();
}

Status EmbeddedScheduler::Stop(Deadline deadline) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (deadline.infinite()) {
      ended_.wait(lock, [this] { return done_; });
    } else {
      ended_.wait_until(lock, deadline.at(), [this] { return done_; });
    }
  }
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

}  // namespace gradsync::server
