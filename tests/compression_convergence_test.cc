// Convergence with gradient compression through the real SDK: 4 worker
// processes train logistic regression (tests/logreg_worker) once without
// compression and once per compressor with error feedback (PowerSGD always
// has it); every final loss must be within 2% of the uncompressed one.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/logreg_job.h"

namespace gradsync {
namespace {

constexpr int kWorkers = 4;

LogregOutcome Train(const std::string& spec) {
  return TrainLogreg(spec, kWorkers, 0, {"--compression=" + spec});
}

TEST(CompressionConvergenceTest, EveryCompressorWithErrorFeedbackEndsWithin2PercentOfNone) {
  const LogregOutcome base = Train("none");
  ASSERT_GT(base.loss, 0) << "the uncompressed run did not report a loss";
  ASSERT_LT(base.loss, 0.6) << "the uncompressed run did not learn";
  for (const std::string spec :
       {"fp16:ef=1", "bf16:ef=1", "randomk:ratio=0.25,ef=1", "topk:ratio=0.05,ef=1",
        "topk_sampled_fp16:ratio=0.05,ef=1", "sign:ef=1", "qsgd:ef=1", "powersgd:rank=2"}) {
    const LogregOutcome got = Train(spec);
    ASSERT_GT(got.loss, 0) << spec;
    const double rel = std::fabs(got.loss - base.loss) / base.loss;
    std::printf("%-36s final loss %.5f (none %.5f, %+.2f%%), compression ratio %.1f\n",
                spec.c_str(), got.loss, base.loss, 100 * (got.loss - base.loss) / base.loss,
                got.raw / got.wire);
    EXPECT_LE(rel, 0.02) << spec << ": final loss " << got.loss << " vs " << base.loss;
  }
}

}  // namespace
}  // namespace gradsync
