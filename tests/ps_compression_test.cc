// Convergence with gradient compression on the parameter-server path:
// 4 trainer processes push compressed gradient partitions to 2 shard
// processes, which decompress and average them in fp32. Every compressor
// with error feedback must end within 2% of the uncompressed PS run, and
// must have sent at least the bytes its format saves.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/logreg_job.h"

namespace gradsync {
namespace {

constexpr int kWorkers = 4;
constexpr int kServers = 2;

LogregOutcome TrainPs(const std::string& spec, const std::string& reply = "none") {
  // 1 KiB partitions: the 4 KiB gradient is spread over both shards.
  return TrainLogreg("ps_" + spec + "_" + reply, kWorkers, kServers,
                     {"--path=ps", "--partition_bytes=1024", "--compression=" + spec,
                      "--ps_reply_compression=" + reply});
}

struct Case {
  std::string spec;
  std::string reply;
  double min_ratio;  // raw / wire bytes of the pushes, from the format
};

TEST(PsCompressionTest, EveryCompressorWithErrorFeedbackEndsWithin2PercentOfNone) {
  const LogregOutcome base = TrainPs("none");
  ASSERT_GT(base.loss, 0) << "the uncompressed run did not report a loss";
  ASSERT_LT(base.loss, 0.6) << "the uncompressed run did not learn";
  // 256-element partitions: fp16 halves them, top-k 5% keeps 13 of 256
  // (index + value), sign keeps one scale and 32 bytes of bits.
  const std::vector<Case> cases = {
      {"fp16:ef=1", "none", 2.0},
      {"bf16:ef=1", "bf16", 2.0},
      {"randomk:ratio=0.25,ef=1", "none", 4.0},
      {"topk:ratio=0.05,ef=1", "fp16", 256.0 / (13 * 2)},
      {"topk_sampled_fp16:ratio=0.05,ef=1", "none", 1024.0 / (13 * 6)},
      {"sign:ef=1", "none", 1024.0 / 36},
      {"qsgd:ef=1", "none", 1024.0 / 260},
  };
  for (const Case& c : cases) {
    const LogregOutcome got = TrainPs(c.spec, c.reply);
    ASSERT_GT(got.loss, 0) << c.spec;
    ASSERT_GT(got.wire, 0) << c.spec;
    const double ratio = got.raw / got.wire;
    std::printf("%-36s reply %-4s final loss %.5f (none %.5f, %+.2f%%), push ratio %.1f\n",
                c.spec.c_str(), c.reply.c_str(), got.loss, base.loss,
                100 * (got.loss - base.loss) / base.loss, ratio);
    EXPECT_LE(std::fabs(got.loss - base.loss) / base.loss, 0.02)
        << c.spec << ": final loss " << got.loss << " vs " << base.loss;
    EXPECT_GE(ratio, c.min_ratio * 0.999) << c.spec;
  }
}

}  // namespace
}  // namespace gradsync
