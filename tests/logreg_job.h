// One logistic-regression job (tests/logreg_worker) through the real SDK:
// a scheduler, `servers` shard processes and `workers` trainer processes on
// this machine. The convergence tests of gradient compression run it once
// per compressor.
#ifndef GRADSYNC_TESTS_LOGREG_JOB_H_
#define GRADSYNC_TESTS_LOGREG_JOB_H_

#include <cstdio>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"

namespace gradsync {

struct LogregOutcome {
  double loss = -1;  // rank 0's final loss; -1: none reported
  double wire = 0;   // bytes rank 0 sent, compressed
  double raw = 0;    // the same before compression
};

// Trains with `worker_flags` (--compression=..., --path=ps, ...) for 600
// steps and returns rank 0's report. `tag` names the logs.
inline LogregOutcome TrainLogreg(const std::string& tag, int workers, int servers,
                                 const std::vector<std::string>& worker_flags) {
  std::string name = tag;
  for (char& c : name) {
    if (c == ':' || c == ',' || c == '=' || c == ' ' || c == '-') c = '_';
  }
  LocalJob job(name);
  job.StartScheduler(workers, servers);
  job.SetJob(workers, servers);
  for (int s = 0; s < servers; ++s) {
    job.Start({Runfile("server/gradsync_server"), "--role=server"}, "server" + std::to_string(s));
  }
  std::vector<Subprocess*> procs;
  for (int r = 0; r < workers; ++r) {
    std::vector<std::string> argv = {Runfile("tests/logreg_worker"), "--rank=" + std::to_string(r),
                                     "--compression_min_bytes=0", "--steps=600"};
    argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
    procs.push_back(&job.Start(argv, "worker" + std::to_string(r)));
  }
  LogregOutcome out;
  for (int r = 0; r < workers; ++r) {
    auto code = procs[r]->Wait(Deadline::AfterMs(120000));
    EXPECT_TRUE(code.has_value() && *code == 0) << tag << " worker " << r << ":\n"
                                                << procs[r]->Output();
  }
  const std::string text = procs[0]->Output();
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

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_LOGREG_JOB_H_
