// PsClient::Exchange: one PushPull of the parameter-server client in flight
// (pushes and pulls of every partition, resends, answers), and the holds
// its sends keep on the caller's buffer. Internal to client/ps_client.cc and
// ps_client_exchange.cc.
#ifndef GRADSYNC_CLIENT_PS_CLIENT_EXCHANGE_H_
#define GRADSYNC_CLIENT_PS_CLIENT_EXCHANGE_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "common/placement.h"

namespace gradsync::client {

// Counts the sends that still point into the caller's buffer. Shared with
// the payload owners, which may outlive the operation.
class PsSendHolds {
 public:
  static std::shared_ptr<const void> Hold(const std::shared_ptr<PsSendHolds>& self) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      ++self->held_;
    }
    return std::shared_ptr<const void>(nullptr, [self](const void*) { self->Release(); });
  }

  bool WaitReleased(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline.at(), [&] { return held_ == 0; });
  }

 private:
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    --held_;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int held_ = 0;
};

// One PushPull: pushes and pulls for every partition, resends, answers.
class PsClient::Exchange {
 public:
  Exchange(PsClient* client, uint32_t bucket, uint8_t* data, uint64_t round, const OpTag& tag,
           Deadline deadline)
      : c_(client),
        bucket_(bucket),
        data_(data),
        round_(round),
        tag_(tag),
        deadline_(deadline),
        holds_(std::make_shared<PsSendHolds>()) {}

  // `encoders`: one per partition, or none (uncompressed).
  Status Run(std::vector<PartitionSpan> plan, BucketState* bucket);
  Traffic traffic() const { return traffic_; }

 private:
  struct Part {
    bool acked = false;
    bool replied = false;
    wire::Message reply;
    uint64_t version = 0;
    // A compressed push: its bytes and how they are encoded.
    std::optional<wire::Payload> compressed;
    wire::DataFields encoding;
  };

  Status Compress(BucketState* bucket);
  // `threshold`: the bucket's k-th largest magnitude key (0 when none).
  std::vector<size_t> SharedBudget(BucketState* bucket, uint32_t* threshold) const;
  Status SendAll(const std::vector<uint64_t>& versions, bool resend);
  Status Send(size_t p, wire::MsgType type, uint64_t version);
  Status Decode(size_t p);
  Status OnMessage(wire::Incoming in);
  std::string Missing() const;
  int ShardOf(const wire::Route& from) const;

  PsClient* const c_;
  const uint32_t bucket_;
  uint8_t* const data_;
  const uint64_t round_;
  const OpTag tag_;
  const Deadline deadline_;
  std::shared_ptr<PsSendHolds> holds_;
  wire::PostedSends posted_;  // the pushes and pulls of this exchange
  std::vector<PartitionSpan> plan_;
  std::vector<Part> parts_;
  std::vector<size_t> lane_;  // per partition: the shard's lane it goes over
  size_t remaining_ = 0;
  bool push_ = true;
  bool busy_ = false;  // a shard answered Busy since the loop last looked
  Traffic traffic_;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_PS_CLIENT_EXCHANGE_H_
