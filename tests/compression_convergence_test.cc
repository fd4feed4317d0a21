// Convergence with gradient compression through the real SDK: 4 worker
// processes train logistic regression (tests/logreg_worker) once without
// compression and once per compressor with error feedback; every final loss
// must be within 2% of the uncompressed one.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"

namespace gradsync {
namespace {

constexpr int kWorkers = 4;

struct Outcome {
  double loss = -1;
  double wire = 0;
  double raw = 0;
};

// Runs one job with `spec` and returns rank 0's report.
Outcome Train(const std::string& spec) {
  std::string tag = spec;
  for (char& c : tag) {
    if (c == ':' || c == ',' || c == '=') c = '_';
  }
  LocalJob job(tag);
  job.StartScheduler(kWorkers, 0);
  job.SetJob(kWorkers, 0);
  std::vector<Subprocess*> workers;
  for (int r = 0; r < kWorkers; ++r) {
    workers.push_back(&job.Start({Runfile("tests/logreg_worker"), "--rank=" + std::to_string(r),
                                  "--compression=" + spec, "--compression_min_bytes=0", "--steps=600"},
                                 "worker" + std::to_string(r)));
  }
  Outcome out;
  for (int r = 0; r < kWorkers; ++r) {
    auto code = workers[r]->Wait(Deadline::AfterMs(120000));
    EXPECT_TRUE(code.has_value() && *code == 0) << spec << " worker " << r << ":\n"
                                                << workers[r]->Output();
  }
  const std::string text = workers[0]->Output();
  unsigned long long wire = 0, raw = 0;
  const size_t at = text.find("final loss ");
  if (at != std::string::npos &&
      std::sscanf(text.c_str() + at, "final loss %lf wire bytes %llu raw bytes %llu", &out.loss,
                  &wire, &raw) == 3) {
    out.wire = static_cast<double>(wire);
    out.raw = static_cast<double>(raw);
  }
  return out;
}

TEST(CompressionConvergenceTest, EveryCompressorWithErrorFeedbackEndsWithin2PercentOfNone) {
  const Outcome base = Train("none");
  ASSERT_GT(base.loss, 0) << "the uncompressed run did not report a loss";
  ASSERT_LT(base.loss, 0.6) << "the uncompressed run did not learn";
  for (const std::string spec :
       {"fp16:ef=1", "bf16:ef=1", "randomk:ratio=0.25,ef=1", "topk:ratio=0.05,ef=1",
        "topk_sampled_fp16:ratio=0.05,ef=1", "sign:ef=1", "qsgd:ef=1"}) {
    const Outcome got = Train(spec);
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
