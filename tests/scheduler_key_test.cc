// The scheduler's own key, pinned by every node (wire/curve.h). A job member
// holds the job's key pair, so it can serve a scheduler with that pair and
// write its address where the others look for the scheduler (the c10d store
// under torch.distributed, GRADSYNC_SCHEDULER). Here that member is a real
// gradsync scheduler process serving with the job's pair; a worker given the
// members' copy of the job key is sent to it. The worker's CURVE handshake
// fails against it (it pins the scheduler's public key): the worker never
// registers there and ends naming the scheduler it could not reach, and
// the same worker joins the real scheduler. A scheduler given the members'
// copy refuses to start, naming why.
#include <signal.h>

#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"
#include "wire/curve.h"

namespace gradsync {
namespace {

class SchedulerKeyTest : public ::testing::Test, public LocalJob {
 protected:
  void SetUp() override {
    job_ = *wire::GenerateJobKey();
    full_ = TmpFile(Name("scheduler.key"));
    members_ = TmpFile(Name("members.key"));
    stolen_ = TmpFile(Name("stolen.key"));
    ASSERT_TRUE(wire::WriteKeyFile(full_, job_).ok());
    ASSERT_TRUE(wire::WriteKeyFile(members_, wire::MembersCopy(job_)).ok());
    // What a member can write from its copy: the job's pair alone.
    ASSERT_TRUE(
        wire::WriteKeyFile(stolen_, wire::CurveKey{job_.public_z85, job_.secret_z85, "", ""}).ok());
  }

  Subprocess& Worker(const std::string& scheduler, const std::string& name) {
    SetJob(1, 0);
    env_["GRADSYNC_SCHEDULER"] = scheduler;
    env_["GRADSYNC_KEY_FILE"] = members_;
    return Start({Runfile("tests/sdk_worker"), "--rank=0", "--mode=train", "--steps=2",
                  "--metrics_base_port=0", "--connect_timeout_ms=3000"},
                 name);
  }

  wire::CurveKey job_;
  std::string full_, members_, stolen_;
};

TEST_F(SchedulerKeyTest, AMemberServingWithTheJobKeyIsNotTakenForTheScheduler) {
  tag_ = "fake";
  const std::string fake = StartScheduler(1, 0, {"--key_file=" + stolen_, "--metrics_port=0"});
  Subprocess& fooled = Worker(fake, "fooled");
  auto code = fooled.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << fooled.Output();
  EXPECT_NE(0, *code) << fooled.Output();
  EXPECT_NE(std::string::npos, fooled.Output().find("scheduler at " + fake)) << fooled.Output();
  EXPECT_NE(std::string::npos, fooled.Output().find("refused the handshake")) << fooled.Output();
  // The fake never saw a registration.
  EXPECT_EQ(std::string::npos, scheduler_->Output().find("worker 0")) << scheduler_->Output();
  scheduler_->Signal(SIGTERM);
  scheduler_->Wait(Deadline::AfterMs(10000));

  tag_ = "real";
  const std::string real = StartScheduler(1, 0, {"--key_file=" + full_, "--metrics_port=0"});
  Subprocess& joined = Worker(real, "joined");
  code = joined.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << joined.Output();
  EXPECT_EQ(0, *code) << joined.Output();
  EXPECT_NE(std::string::npos, joined.Output().find("finished step")) << joined.Output();
  scheduler_->Signal(SIGTERM);
  scheduler_->Wait(Deadline::AfterMs(10000));
}

TEST_F(SchedulerKeyTest, ASchedulerGivenTheMembersCopyRefusesToStart) {
  auto p = Subprocess::Spawn(
      {Runfile("server/gradsync_server"), "--role=scheduler", "--port=0", "--num_workers=1",
       "--num_servers=0", "--metrics_port=0", "--key_file=" + members_},
      {}, TmpFile(Name("scheduler")));
  ASSERT_TRUE(p.ok()) << p.status();
  auto code = p->Wait(Deadline::AfterMs(20000));
  ASSERT_TRUE(code.has_value()) << p->Output();
  EXPECT_NE(0, *code);
  EXPECT_NE(std::string::npos, p->Output().find("members' copy")) << p->Output();
}

}  // namespace
}  // namespace gradsync
