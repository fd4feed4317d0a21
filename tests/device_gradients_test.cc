// CUDA gradients end to end (needs a GPU; tagged gpu): workers that are
// members of a host-gradient job and a CUDA-gradient job at once
// (tests/device_worker.cc) must get bit-identical synchronised gradients
// from both, over the CPU ring with 4 processes sharing the GPU (with and
// without compression, on the device or through the host fallback), the
// parameter server, and NCCL at world size 1 (one GPU admits one NCCL rank).
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"

namespace gradsync {
namespace {

class DeviceGradientsTest : public ::testing::Test {
 protected:
  // Runs `workers` device_workers with `settings` against two fresh jobs
  // (and `servers` shards in each) and expects every one to pass.
  void RunJobs(int workers, int servers, const std::vector<std::string>& settings,
               const std::string& refused = "") {
    const std::string round = std::to_string(rounds_++);
    LocalJob host("host" + round), dev("cuda" + round);
    const std::string host_address = host.StartScheduler(workers, servers);
    const std::string dev_address = dev.StartScheduler(workers, servers);
    host.SetJob(workers, servers);
    dev.SetJob(workers, servers);
    for (int s = 0; s < servers; ++s) {
      host.Start({Runfile("server/gradsync_server"), "--role=server"},
                 "server" + std::to_string(s));
      dev.Start({Runfile("server/gradsync_server"), "--role=server"}, "server" + std::to_string(s));
    }
    std::vector<Subprocess*> procs;
    for (int r = 0; r < workers; ++r) {
      std::vector<std::string> argv = {Runfile("tests/device_worker"),
                                       "--rank=" + std::to_string(r),
                                       "--num_workers=" + std::to_string(workers),
                                       "--num_servers=" + std::to_string(servers),
                                       "--host_scheduler=" + host_address,
                                       "--device_scheduler=" + dev_address,
                                       "--bucket_bytes=2097152",
                                       "--first_bucket_bytes=1048576",
                                       "--metrics_base_port=0"};
      argv.insert(argv.end(), settings.begin(), settings.end());
      procs.push_back(&dev.Start(argv, "worker" + std::to_string(r)));
    }
    for (int r = 0; r < workers; ++r) {
      auto code = procs[r]->Wait(Deadline::AfterMs(180000));
      ASSERT_TRUE(code.has_value()) << "worker " << r << " still running:\n" << procs[r]->Output();
      if (!refused.empty()) {  // a gradsync error (exit 3) saying `refused`
        EXPECT_EQ(*code, 3) << procs[r]->Output();
        EXPECT_NE(procs[r]->Output().find(refused), std::string::npos) << procs[r]->Output();
        continue;
      }
      EXPECT_EQ(*code, 0) << procs[r]->Output();
      EXPECT_NE(procs[r]->Output().find("device path ok"), std::string::npos) << procs[r]->Output();
      EXPECT_NE(procs[r]->Output().find("is host memory"), std::string::npos) << procs[r]->Output();
    }
  }

  int rounds_ = 0;  // RunJobs calls: each round's logs are its own
};

TEST_F(DeviceGradientsTest, RingFourProcessesUncompressed) { RunJobs(4, 0, {}); }

TEST_F(DeviceGradientsTest, RingFourProcessesFp16AndBf16OnTheDevice) {
  RunJobs(4, 0, {"--compression=fp16", "--compression_overrides=fc2.weight=bf16"});
}

TEST_F(DeviceGradientsTest, RingFourProcessesFp16WithErrorFeedback) {
  RunJobs(4, 0, {"--compression=fp16:ef=1"});
}

TEST_F(DeviceGradientsTest, RingFourProcessesTopKWithErrorFeedbackAndFp16Values) {
  RunJobs(4, 0,
          {"--compression=topk:ratio=0.01,ef=1",
           "--compression_overrides=fc2.weight=topk_fp16:ratio=0.05"});
}

// Both jobs draw from the same seed (compression_seed), so that QSGD and
// random-k draw the same numbers in both.
TEST_F(DeviceGradientsTest, RingFourProcessesSignQsgdRandomK) {
  RunJobs(4, 0,
          {"--compression=sign:ef=1", "--compression_seed=77",
           "--compression_overrides=fc2.weight=qsgd:ef=1;embedding=randomk:ratio=0.1,ef=1"});
}

TEST_F(DeviceGradientsTest, RingFourProcessesQsgdRandomKNoErrorFeedbackSampledTopK) {
  RunJobs(4, 0,
          {"--compression=qsgd:chunk=256,levels=15", "--compression_seed=78",
           "--compression_overrides=fc2.weight=randomk:ratio=0.05;"
           "embedding=topk_sampled:ratio=0.01,ef=1"});
}

// PowerSGD has no device form: it runs on a pinned host copy.
TEST_F(DeviceGradientsTest, RingFourProcessesPowerSgdOnTheHost) {
  RunJobs(4, 0, {"--compression=powersgd:rank=2", "--compression_seed=79"});
}

TEST_F(DeviceGradientsTest, ParameterServerTwoProcesses) {
  RunJobs(2, 1, {"--path=ps", "--f32_only"});
}

// Compressed pushes are made on the GPU, partition by partition, each with
// its own residual; with 1 MiB partitions fc1.weight's bucket (4 MB) spans
// four and the embedding's two. Top-k over several partitions shares its
// budget over the bucket and is chosen on the host on both paths. (QSGD and
// random-k are left out: on this path they draw from the job id, which
// differs between the two jobs.)
TEST_F(DeviceGradientsTest, ParameterServerTwoProcessesCompressedOnTheDevice) {
  RunJobs(2, 1, {"--path=ps", "--f32_only", "--compression=fp16"});
  RunJobs(2, 1,
          {"--path=ps", "--f32_only", "--compression=fp16:ef=1", "--partition_bytes=1048576",
           "--compression_overrides=fc1.weight=topk:ratio=0.01,ef=1;"
           "fc2.weight=sign:ef=1;embedding=bf16"});
  RunJobs(2, 1,
          {"--path=ps", "--f32_only", "--compression=topk:ratio=0.01,ef=1",
           "--partition_bytes=1048576"});
}

TEST_F(DeviceGradientsTest, NcclWorldOneEveryCompressor) {
  RunJobs(1, 0,
          {"--backend=nccl", "--compression=topk:ratio=0.01,ef=1",
           "--compression_overrides=fc2.weight=fp16:ef=1;embedding=bf16"});
  RunJobs(1, 0,
          {"--backend=nccl", "--compression=sign:ef=1", "--compression_seed=80",
           "--compression_overrides=fc2.weight=qsgd:ef=1;embedding=randomk:ratio=0.1"});
}

TEST_F(DeviceGradientsTest, NcclWorldOneUncompressed) { RunJobs(1, 0, {"--backend=nccl"}); }

// fp16 without error feedback: the averaged values are widened from the
// wire straight into the tensors; one bucket of many tensors among them.
TEST_F(DeviceGradientsTest, NcclWorldOneFp16WidenedIntoTheTensors) {
  RunJobs(1, 0,
          {"--backend=nccl", "--compression=fp16", "--compression_overrides=fc2.weight=bf16",
           "--bucket_bytes=8388608"});
}

// Two ranks of an NCCL job on the one GPU: refused before NCCL starts,
// naming both ranks.
TEST_F(DeviceGradientsTest, NcclRefusesTwoRanksOnOneGpu) {
  RunJobs(2, 0, {"--backend=nccl", "--cuda_device=0"}, "ranks 0 and 1 both use GPU ");
}

}  // namespace
}  // namespace gradsync
