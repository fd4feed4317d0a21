// The OpenMPI peer of allreduce_bench: MPI_Allreduce (fp32 sum, in place)
// timed the way allreduce_bench times the others, so that its parent can put
// the numbers beside ours. Started by allreduce_bench under mpirun, once with
// the TCP transport only (--mca btl self,tcp) and once with OpenMPI's default
// (shared memory between ranks of one host).
//
// For every size: one all-reduce of known integer-valued data whose exact sum
// is checked (a wrong sum exits 4); warm-up rounds; then timed rounds, each:
// restore the input, MPI_Barrier, time one MPI_Allreduce. A round's time is
// the max over ranks; rank 0 writes, per size, one line
//   IMPL BYTES P50_US MIN_US P90_US 0
// to --results (the format of allreduce_bench's results file).
//
//   mpirun -np N mpi_allreduce --impl=openmpi --results=FILE
//       --plan=BYTES:WARMUP:ITERS[,BYTES:WARMUP:ITERS...]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

constexpr size_t kPeriod = 509;  // as allreduce_bench's input pattern

float Pattern(size_t j, int first, int end) {
  float sum = 0.0f;
  for (int k = first; k < end; ++k) sum += static_cast<float>((j * 7 + k * 131) % kPeriod);
  return sum;
}

struct Step {
  size_t bytes = 0;
  int warmup = 0;
  int iters = 0;
};

[[noreturn]] void Die(const std::string& why, int code = 3) {
  std::fprintf(stderr, "mpi_allreduce: %s\n", why.c_str());
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

std::vector<Step> ParsePlan(const std::string& plan) {
  std::vector<Step> steps;
  size_t at = 0;
  while (at < plan.size()) {
    size_t end = plan.find(',', at);
    if (end == std::string::npos) end = plan.size();
    Step s;
    if (std::sscanf(plan.substr(at, end - at).c_str(), "%zu:%d:%d", &s.bytes, &s.warmup,
                    &s.iters) != 3 ||
        s.bytes < 4 || s.iters < 1 || s.warmup < 0) {
      Die("bad --plan entry '" + plan.substr(at, end - at) + "'", 2);
    }
    steps.push_back(s);
    at = end + 1;
  }
  return steps;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string impl = "openmpi", results, plan;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--impl=", 0) == 0)
      impl = a.substr(7);
    else if (a.rfind("--results=", 0) == 0)
      results = a.substr(10);
    else if (a.rfind("--plan=", 0) == 0)
      plan = a.substr(7);
    else
      Die("unknown flag " + a, 2);
  }
  if (plan.empty() || results.empty()) Die("--plan and --results are required", 2);
  std::ofstream out;
  if (rank == 0) {
    out.open(results);
    if (!out) Die("cannot write " + results);
  }
  for (const Step& step : ParsePlan(plan)) {
    const size_t count = step.bytes / sizeof(float);
    std::vector<float> input(count), data(count);
    for (size_t i = 0; i < count; ++i) input[i] = Pattern(i % kPeriod, rank, rank + 1);
    data = input;
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != Pattern(i % kPeriod, 0, world)) {
        Die(impl + " gave a wrong sum on rank " + std::to_string(rank) + " at element " +
                std::to_string(i),
            4);
      }
    }
    std::vector<double> rounds;
    for (int it = 0; it < step.warmup + step.iters; ++it) {
      std::memcpy(data.data(), input.data(), step.bytes);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      double us = (MPI_Wtime() - t0) * 1e6, slowest = 0;
      MPI_Reduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (it >= step.warmup) rounds.push_back(slowest);
    }
    if (rank == 0) {
      out << impl << " " << step.bytes << " " << Percentile(rounds, 0.5) << " "
          << Percentile(rounds, 0.0) << " " << Percentile(rounds, 0.9) << " 0\n";
    }
  }
  MPI_Finalize();
  return 0;
}
