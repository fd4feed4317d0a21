// Compress and decompress throughput of every builtin compressor, beside a
// memcpy of the same fp32 data in the same run, on 1 and 2 threads.
//
// Each thread has its own compressor instance and its own slice of the
// elements; a repetition's time runs from the common start to the last
// thread's end, and the tables show the median over repetitions, in
// Gelem/s of input elements (fp32), so 1 Gelem/s = 4 GB/s of gradients.
// Two bucket sizes by default: 2^18 elements (1 MiB, the first bucket,
// cache-resident) and 2^22 (16 MiB, closer to the 25 MiB buckets, bound by
// memory bandwidth on a small machine). Then one JSON line per measurement:
//   {"compressor","op","threads","gelem_s","memcpy_gelem_s","elements"}
//
// PowerSGD ("powersgd:rank=R", not a Compressor) has one op, "reduce": a
// single rank's Begin, Middle and Finish with the all-reduces left out (both matrix products,
// the orthogonalisation, the residual and the rebuilt bucket).
//
// Usage: compression_bench [--quick] [--elements=N[,N...]] [--reps=R]
//                          [--compressors=spec;spec;...]
// Default: every builtin name with default options and powersgd:rank=4,
// 15 repetitions.
// --quick: 5 repetitions (finishes in well under a minute).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/config.h"
#include "compression/compressor.h"
#include "compression/powersgd.h"
#include "compression/registry.h"

namespace gradsync::compression {
namespace {

struct Flags {
  bool quick = false;
  std::vector<size_t> elements = {size_t{1} << 18, size_t{1} << 22};
  int reps = 15;
  std::vector<std::string> specs;  // Empty: every builtin.
};

struct Row {
  std::string compressor;
  std::string op;
  int threads = 0;
  double gelem_s = 0;
  double memcpy_gelem_s = 0;
  size_t elements = 0;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  GS_ASSIGN_OR_RETURN(Config config, Config::FromArgs(argc, argv, nullptr));
  Flags flags;
  GS_ASSIGN_OR_RETURN(flags.quick, config.GetBool("quick", false));
  GS_ASSIGN_OR_RETURN(int64_t reps, config.GetInt("reps", flags.quick ? 5 : flags.reps));
  flags.reps = static_cast<int>(std::clamp<int64_t>(reps, 1, 1000000));
  GS_ASSIGN_OR_RETURN(std::string elements, config.GetString("elements", ""));
  if (!elements.empty()) {
    GS_ASSIGN_OR_RETURN(flags.elements, bench::ParseSizes(elements));
  }
  GS_ASSIGN_OR_RETURN(std::string specs, config.GetString("compressors", ""));
  if (!specs.empty()) flags.specs = bench::Split(specs, ';');
  GS_RETURN_IF_ERROR(config.CheckKnownFlags());
  return flags;
}

// Runs body(thread) on `threads` threads `reps` times after one warm-up;
// returns the median time from the common start to the last thread's end.
// Threads wait on an atomic generation counter (spinning with yield, so a
// busy 2-core machine is not starved) between repetitions.
double TimeParallel(int threads, int reps, const std::function<void(int)>& body) {
  std::atomic<int> generation{0}, done{0};
  std::vector<double> ends(threads);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int g = 1; g <= reps + 1; ++g) {
        while (generation.load(std::memory_order_acquire) < g) {
          std::this_thread::yield();
        }
        body(t);
        ends[t] = Now();
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  }
  std::vector<double> times;
  for (int g = 1; g <= reps + 1; ++g) {
    done.store(0, std::memory_order_relaxed);
    const double start = Now();
    generation.store(g, std::memory_order_release);
    body(0);
    ends[0] = Now();
    while (done.load(std::memory_order_acquire) < threads - 1) {
      std::this_thread::yield();
    }
    const double end = *std::max_element(ends.begin(), ends.end());
    if (g > 1) times.push_back(end - start);  // g == 1 warms up.
  }
  for (std::thread& th : pool) th.join();
  return bench::Quantile(times, 0.5);
}

// One compressor on `threads` threads: per-thread instances, slices, wires.
struct Setup {
  std::vector<std::unique_ptr<Compressor>> compressors;
  std::vector<size_t> first, count;
  std::vector<std::vector<uint8_t>> wires;
};

bool MakeSetup(const CompressorRegistry& registry, const std::string& spec, int threads, size_t n,
               Setup* setup) {
  for (int t = 0; t < threads; ++t) {
    StatusOr<std::unique_ptr<Compressor>> c = registry.Create(spec);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return false;
    }
    setup->first.push_back(n * t / threads);
    setup->count.push_back(n * (t + 1) / threads - setup->first.back());
    setup->wires.emplace_back((*c)->WireBytes(setup->count.back()));
    setup->compressors.push_back(std::move(c).value());
  }
  return true;
}

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

// Small buckets take more repetitions (up to 16x) for a stable median.
int Repetitions(const Flags& flags, size_t n) {
  return flags.reps * static_cast<int>(std::clamp<size_t>((size_t{1} << 22) / n, 1, 16));
}

std::vector<Row> BenchOne(const CompressorRegistry& registry, const std::string& spec, int threads,
                          const Flags& flags, const std::vector<float>& in,
                          std::vector<float>* out) {
  Setup s;
  if (!MakeSetup(registry, spec, threads, in.size(), &s)) std::exit(1);
  // Every compress is a new step (seeded compressors draw anew); decompress
  // uses the step compressed last, as a rank does after its all-reduce.
  std::vector<uint64_t> steps(threads, 1);
  const CompressContext base{42, 0, 3};
  auto compress = [&](int t) {
    CompressContext ctx = base;
    ctx.step = steps[t]++;
    Check(s.compressors[t]->Compress(in.data() + s.first[t], s.count[t], ctx, s.wires[t].data(),
                                     s.wires[t].size()));
  };
  auto decompress = [&](int t) {
    CompressContext ctx = base;
    ctx.step = steps[t] - 1;
    Check(s.compressors[t]->Decompress(s.wires[t].data(), s.wires[t].size(), s.count[t], ctx,
                                       out->data() + s.first[t]));
  };
  auto copy = [&](int t) {
    std::memcpy(out->data() + s.first[t], in.data() + s.first[t], s.count[t] * sizeof(float));
  };
  const double n = static_cast<double>(in.size());
  const int reps = Repetitions(flags, in.size());
  const double c_time = TimeParallel(threads, reps, compress);
  const double m_time = TimeParallel(threads, reps, copy);
  const double d_time = TimeParallel(threads, reps, decompress);
  return {{spec, "compress", threads, n / c_time / 1e9, n / m_time / 1e9, in.size()},
          {spec, "decompress", threads, n / d_time / 1e9, n / m_time / 1e9, in.size()}};
}

// PowerSGD on one rank: each thread reduces its own slice as one bucket,
// in place in its own copy, with sums that leave the factors as they are.
Row BenchPowerSgd(const std::string& spec, int threads, const Flags& flags,
                  const std::vector<float>& in, std::vector<float>* out) {
  std::vector<std::unique_ptr<PowerSgd>> psgd;
  std::vector<std::vector<float>> work;
  const size_t n = in.size();
  for (int t = 0; t < threads; ++t) {
    StatusOr<std::unique_ptr<PowerSgd>> p = PowerSgd::Create(spec);
    Check(p.status());
    psgd.push_back(std::move(p).value());
    work.emplace_back(in.begin() + n * t / threads, in.begin() + n * (t + 1) / threads);
  }
  std::vector<uint64_t> steps(threads, 0);
  auto reduce = [&](int t) {
    PowerSgd& p = *psgd[t];
    p.Begin(work[t].data(), work[t].size(), CompressContext{42, steps[t]++, 3});
    p.Middle();
    p.Finish(work[t].data(), 1);
  };
  auto copy = [&](int t) {
    std::memcpy(out->data() + n * t / threads, in.data() + n * t / threads,
                work[t].size() * sizeof(float));
  };
  const int reps = Repetitions(flags, n);
  const double r_time = TimeParallel(threads, reps, reduce);
  const double m_time = TimeParallel(threads, reps, copy);
  const double elems = static_cast<double>(n);
  return {spec, "reduce", threads, elems / r_time / 1e9, elems / m_time / 1e9, n};
}

const Row* Find(const std::vector<Row>& rows, const std::string& compressor, const std::string& op,
                int threads) {
  for (const Row& r : rows) {
    if (r.compressor == compressor && r.op == op && r.threads == threads) {
      return &r;
    }
  }
  return nullptr;
}

// One line per compressor and op: 1 and 2 threads, memcpy beside them.
void PrintTable(const std::vector<Row>& rows, size_t n) {
  std::printf("\n%zu fp32 elements (%.0f MiB), median Gelem/s\n", n, n * 4.0 / (1 << 20));
  std::printf("%-20s %-10s | %8s %8s | %8s %8s | %8s\n", "compressor", "op", "1 thread", "memcpy",
              "2 thread", "memcpy", "1t/memcpy");
  for (const Row& r : rows) {
    if (r.threads != 1) continue;
    const Row* two = Find(rows, r.compressor, r.op, 2);
    std::printf("%-20s %-10s | %8.3f %8.3f | %8.3f %8.3f | %8.2f\n", r.compressor.c_str(),
                r.op.c_str(), r.gelem_s, r.memcpy_gelem_s, two ? two->gelem_s : 0.0,
                two ? two->memcpy_gelem_s : 0.0, r.gelem_s / r.memcpy_gelem_s);
  }
}

void PrintJson(const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    std::printf(
        "{\"compressor\":\"%s\",\"op\":\"%s\",\"threads\":%d,"
        "\"gelem_s\":%.4f,\"memcpy_gelem_s\":%.4f,\"elements\":%zu}\n",
        r.compressor.c_str(), r.op.c_str(), r.threads, r.gelem_s, r.memcpy_gelem_s, r.elements);
  }
}

// The throughput targets, per core: both ops of fp16 / bf16 >= 5, compress
// of topk_sampled >= 1, both ops of sign and qsgd >= 2 Gelem/s.
void PrintTargets(const std::vector<Row>& rows) {
  struct Target {
    const char* compressor;
    const char* op;  // nullptr: both.
    double per_core;
  };
  const Target targets[] = {{"fp16", nullptr, 5},
                            {"bf16", nullptr, 5},
                            {"topk_sampled", "compress", 1},
                            {"sign", nullptr, 2},
                            {"qsgd", nullptr, 2}};
  std::printf("\ntargets (per core = Gelem/s / threads):\n");
  for (const Target& t : targets) {
    for (const Row& r : rows) {
      if (r.compressor != t.compressor) continue;
      if (t.op != nullptr && r.op != t.op) continue;
      const double per_core = r.gelem_s / r.threads;
      std::printf(
          "  %-13s %-10s %8zu elements, %d thread(s): %6.2f per core,"
          " target %.0f: %s\n",
          t.compressor, r.op.c_str(), r.elements, r.threads, per_core, t.per_core,
          per_core >= t.per_core ? "met" : "NOT met");
    }
  }
  std::printf("\n");
}

int Main(int argc, char** argv) {
  StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "compression_bench: %s\n", parsed.status().message().c_str());
    return 2;
  }
  Flags flags = *parsed;
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  if (flags.specs.empty()) {
    flags.specs = registry.Names();
    flags.specs.push_back("powersgd:rank=4");
  }
  std::vector<Row> all;
  for (size_t n : flags.elements) {
    std::vector<float> in(n), out(n, 0.0f);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    for (float& x : in) x = normal(rng);
    std::vector<Row> rows;
    for (const std::string& spec : flags.specs) {
      for (int threads : {1, 2}) {
        if (PowerSgd::Names(spec)) {
          rows.push_back(BenchPowerSgd(spec, threads, flags, in, &out));
          continue;
        }
        for (Row& r : BenchOne(registry, spec, threads, flags, in, &out)) {
          rows.push_back(std::move(r));
        }
      }
    }
    PrintTable(rows, n);
    all.insert(all.end(), rows.begin(), rows.end());
  }
  PrintTargets(all);
  PrintJson(all);
  return 0;
}

}  // namespace
}  // namespace gradsync::compression

int main(int argc, char** argv) { return gradsync::compression::Main(argc, argv); }
