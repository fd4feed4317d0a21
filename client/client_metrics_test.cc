#include "client/client_metrics.h"

#include <string>

#include "common/metrics.h"
#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

TEST(ClientMetricsTest, FailureReasons) {
  EXPECT_EQ(ReasonOf(DeadlineExceededError("x"), SyncPath::kRing), FailureReason::kTimeout);
  EXPECT_EQ(ReasonOf(AbortedError("ranks disagree"), SyncPath::kRing), FailureReason::kMismatch);
  EXPECT_EQ(ReasonOf(FailedPreconditionError("layouts differ"), SyncPath::kRing),
            FailureReason::kMismatch);
  EXPECT_EQ(ReasonOf(AbortedError("shard refused"), SyncPath::kPs), FailureReason::kRejected);
  EXPECT_EQ(ReasonOf(UnavailableError(
                         "worker 3 died (declared dead by the scheduler: no message for 1 s)"),
                     SyncPath::kRing),
            FailureReason::kPeerDead);
  EXPECT_EQ(ReasonOf(UnavailableError("sending to rank 2 failed"), SyncPath::kRing),
            FailureReason::kUnavailable);
  EXPECT_EQ(ReasonOf(InvalidArgumentError("dtype"), SyncPath::kPs), FailureReason::kOther);
  EXPECT_EQ(ReasonOf(MembershipChangedError("worker rank 2 left"), SyncPath::kRing),
            FailureReason::kPeerDead);
}

TEST(ClientMetricsTest, LabelsAndPaths) {
  EXPECT_STREQ(SyncOpLabel(SyncOp::kPushPull), "push_pull");
  EXPECT_STREQ(SyncOpLabel(SyncOp::kBarrier), "barrier");
  EXPECT_STREQ(SyncPathLabel(SyncPath::kNccl), "nccl");
  EXPECT_EQ(SyncPathOf("ps"), SyncPath::kPs);
  EXPECT_EQ(SyncPathOf("nccl"), SyncPath::kNccl);
  EXPECT_EQ(SyncPathOf("ring"), SyncPath::kRing);
}

TEST(ClientMetricsTest, RecordsLatencyRequestsFailuresAndTraffic) {
  ProcessMetrics process("worker");
  ClientMetrics m(process.registry());
  m.Record(SyncOp::kAllReduce, SyncPath::kRing, 0.002, Status());
  m.Record(SyncOp::kAllReduce, SyncPath::kRing, 0.004, Status());
  m.Record(SyncOp::kPushPull, SyncPath::kPs, 1.0, DeadlineExceededError("late"));
  m.Record(SyncOp::kPushPull, SyncPath::kPs, 1.0, CancelledError("shut down"));
  m.Traffic(4000, 1000, 4000, 3000);
  m.Retried(2);
  m.SetBucketsInFlight(3);
  m.SetDeviceBytes(1 << 20);
  m.SetLastCompletedStep(17);
  const std::string text = process.Scrape();
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "\n" << text;
  };
  has("gradsync_client_sync_latency_seconds_count{op=\"allreduce\",path=\"ring\"} 2");
  has("gradsync_client_sync_latency_seconds_bucket{op=\"allreduce\",path=\"ring\",le=\"0.0025\"} "
      "1");
  has("gradsync_client_sync_latency_seconds_count{op=\"push_pull\",path=\"ps\"} 0");
  has("gradsync_client_requests_total{op=\"push_pull\",path=\"ps\"} 2");
  has("gradsync_client_failures_total{reason=\"timeout\"} 1");
  has("gradsync_client_failures_total{reason=\"other\"} 0");
  has("gradsync_client_raw_bytes_total{direction=\"sent\"} 4000");
  has("gradsync_client_wire_bytes_total{direction=\"sent\"} 1000");
  has("gradsync_client_wire_bytes_total{direction=\"received\"} 3000");
  has("gradsync_client_retries_total 2");
  has("gradsync_client_buckets_in_flight 3");
  has("gradsync_client_device_memory_bytes 1048576");
  has("gradsync_client_last_completed_step 17");
}

}  // namespace
}  // namespace gradsync::client
