// A worker process for the cluster tests: joins through the client Session,
// passes barriers, exchanges an NCCL-style id, then stays in the job for a
// while (until a peer is reported dead, or the job ends). Prints one line per
// milestone on stdout.
//
//   rendezvous_worker --scheduler=host:port --num_workers=4 --num_servers=2
//       [--barriers=2] [--hold_ms=0] [--nccl_id]
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "client/session.h"
#include "common/config.h"
#include "common/logging.h"

extern char** environ;

namespace gradsync {
namespace {

int Main(int argc, char** argv) {
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return 2;
  const int64_t barriers = config->GetInt("barriers", 1).value();
  const int64_t hold_ms = config->GetInt("hold_ms", 0).value();
  const bool nccl = config->GetBool("nccl_id", false).value();
  SetLogTag("worker");
  auto session = client::Session::Join(*config, Deadline::AfterMs(60000));
  if (!session.ok()) {
    GS_LOG(ERROR) << "join failed: " << session.status().message();
    return 1;
  }
  client::Session& s = **session;
  std::printf("worker %d joined job %llu\n", s.rank(), static_cast<unsigned long long>(s.job_id()));
  std::fflush(stdout);
  for (int64_t b = 1; b <= barriers; ++b) {
    Status st = s.Barrier(Deadline::AfterMs(30000));
    if (!st.ok()) {
      GS_LOG(ERROR) << "barrier " << b << " failed: " << st.message();
      return 1;
    }
    std::printf("worker %d passed barrier %lld\n", s.rank(), static_cast<long long>(b));
    std::fflush(stdout);
  }
  if (nccl) {
    std::vector<uint8_t> id(128);
    for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 3);
    auto got =
        s.ShareNcclId(s.rank() == 0 ? std::optional(id) : std::nullopt, Deadline::AfterMs(30000));
    if (!got.ok() || *got != id) {
      GS_LOG(ERROR) << "NCCL id exchange failed: "
                    << (got.ok() ? "bytes differ" : got.status().message());
      return 1;
    }
    std::printf("worker %d has the NCCL id\n", s.rank());
    std::fflush(stdout);
  }
  const Deadline hold = Deadline::AfterMs(hold_ms);
  while (!hold.Expired() && s.job_status().ok() && s.dead_peers().empty()) {
    std::this_thread::sleep_for(Millis(20));
  }
  for (const wire::NodeInfo& dead : s.dead_peers()) {
    std::printf("worker %d saw %s dead\n", s.rank(), dead.Name().c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
