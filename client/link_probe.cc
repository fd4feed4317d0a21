#include "client/link_probe.h"

#include <algorithm>
#include <vector>

#include "wire/message.h"
#include "wire/validate.h"

namespace gradsync::client {
namespace {

// The bucket id of an echo's RingData (its index the request's number).
constexpr uint32_t kEchoBucket = 0xfffffffdu;
constexpr int kEchoRounds = 3;  // round trips of each kind timed

// The echo's message: request `id` carrying `bytes`, or its answer (none).
wire::Message EchoMessage(uint64_t id, const std::vector<uint8_t>& bytes) {
  wire::RingDataFields f;
  f.bucket = kEchoBucket;
  f.index = id;
  f.dtype = wire::DType::U8;
  f.num_elements = bytes.size();
  std::vector<wire::Payload> payloads;
  payloads.push_back(wire::Payload::Borrow(bytes.data(), bytes.size(), nullptr));
  return wire::MakeRingData(wire::Sender{}, f, std::move(payloads), /*step=*/0, /*epoch=*/0);
}

// The number of an echo request or answer; nullopt for anything else.
std::optional<uint64_t> EchoId(const wire::Message& m) {
  static const wire::Policy policy = wire::Policy::Accepting({wire::MsgType::RingData});
  const wire::Verdict v = wire::Validate(m, policy);
  if (!v.ok()) return std::nullopt;
  const auto* body = v.header->body_as_RingDataBody();
  if (body->bucket() != kEchoBucket) return std::nullopt;
  return body->index();
}

}  // namespace

StatusOr<std::unique_ptr<LinkEcho>> LinkEcho::Listen(wire::TcpStreamOptions options,
                                                     const std::string& endpoint) {
  std::unique_ptr<LinkEcho> echo(new LinkEcho());
  echo->transport_ = std::make_unique<wire::TcpStreamTransport>(std::move(options));
  GS_ASSIGN_OR_RETURN(std::string bound, echo->transport_->Listen(endpoint));
  echo->port_ = static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  echo->thread_ = std::thread([e = echo.get()] { e->Run(); });
  return echo;
}

LinkEcho::~LinkEcho() {
  stop_.store(true);
  transport_->Shutdown();
  if (thread_.joinable()) thread_.join();
}

void LinkEcho::Run() {
  static const std::vector<uint8_t> kNone;
  while (!stop_.load()) {
    auto in = transport_->Receive(Deadline::After(Millis(200)));
    if (!in.ok()) {
      if (in.status().code() == StatusCode::kCancelled) return;
      continue;  // a deadline, or a connection that broke its framing (counted)
    }
    const std::optional<uint64_t> id = EchoId(in->message);
    if (!id) continue;
    // Posted: a prober that does not read holds back no other.
    transport_->Post(in->from, EchoMessage(*id, kNone), Deadline::After(Millis(2000)), nullptr);
  }
}

StatusOr<LinkTiming> TimeLink(wire::TcpStreamOptions options, const std::string& endpoint,
                              size_t bytes, Deadline deadline) {
  using Clock = std::chrono::steady_clock;
  const std::vector<uint8_t> payload(bytes, 0), none;  // outlive the transport
  wire::TcpStreamTransport transport(std::move(options));
  GS_ASSIGN_OR_RETURN(wire::ConnId conn, transport.Connect(endpoint));
  uint64_t next_id = 0;
  auto round_trip = [&](bool full) -> StatusOr<std::chrono::microseconds> {
    const uint64_t id = ++next_id;
    const Clock::time_point start = Clock::now();
    GS_RETURN_IF_ERROR(transport.Send(wire::Route::Connection(conn),
                                      EchoMessage(id, full ? payload : none), deadline));
    while (!deadline.Expired()) {
      auto in = transport.Receive(deadline);
      if (!in.ok()) {
        if (in.status().code() == StatusCode::kDeadlineExceeded) break;
        return in.status();
      }
      if (EchoId(in->message) != id) continue;  // an earlier answer, late
      return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    }
    return DeadlineExceededError("no answer from " + endpoint +
                                 " to a link-timing echo within the deadline");
  };
  GS_RETURN_IF_ERROR(round_trip(false).status());  // opens the connection
  LinkTiming timing{std::chrono::microseconds::max(), std::chrono::microseconds::max()};
  for (int i = 0; i < kEchoRounds; ++i) {
    GS_ASSIGN_OR_RETURN(auto empty, round_trip(false));
    GS_ASSIGN_OR_RETURN(auto full, round_trip(true));
    timing.empty = std::min(timing.empty, empty);
    timing.full = std::min(timing.full, full);
  }
  return timing;
}

}  // namespace gradsync::client
