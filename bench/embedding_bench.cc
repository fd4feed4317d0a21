// Row updates per second of one shard's embedding table on one core
// (ps/embedding_table.h), beside a memcpy of the same rows: each optimizer
// (sgd, adagrad, adam) applies batches of gradient rows of ids drawn from a
// Zipf distribution over --vocab ids (the rows exist after a warm-up pass,
// as in a table that has trained a while), and pulls them back.
//
//   bazel run --config=opt //bench:embedding_bench -- [--dim=64]
//       [--vocab=10000000] [--batch=8192] [--batches=64] [--reps=7] [--zipf=1.05]
//
// Prints one line per optimizer and pass (median, min and max over the
// repetitions, and the ratio to memcpy of the rows' values) and a JSON line
// per optimizer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "common/config.h"
#include "ps/embedding_table.h"

namespace gradsync::bench {
namespace {

using server::EmbeddingOptions;
using server::EmbeddingTable;
using server::MemoryBudget;
using server::RowOptimizerKind;

struct Args {
  uint32_t dim = 64;
  uint64_t vocab = 10000000;
  size_t batch = 8192;
  size_t batches = 64;
  int reps = 7;
  double zipf = 1.05;
};

// `n` ids Zipf(s)-distributed over [0, vocab), by inverting the CDF of a
// table of the first `vocab` ranks' weights; rank r is id r scrambled, so
// that hot ids do not sit side by side.
std::vector<uint64_t> ZipfIds(uint64_t vocab, double s, size_t n, uint64_t seed) {
  std::vector<double> cdf(vocab);
  double sum = 0;
  for (uint64_t r = 0; r < vocab; ++r) cdf[r] = (sum += 1.0 / std::pow(double(r + 1), s));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, sum);
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
    ids[i] = (r * 0x9E3779B97F4A7C15ull) ^ 0x5bd1e995ull;
  }
  return ids;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct Figures {
  double median, min, max;
};

Figures Summary(const std::vector<double>& rates) {
  return {Quantile(rates, 0.5), *std::min_element(rates.begin(), rates.end()),
          *std::max_element(rates.begin(), rates.end())};
}

// Rows per second of memcpy of `batch` rows of `dim` floats, scattered
// over a table of `vocab` rows as the updates are (the bound of any pass
// that reads and writes each row once).
Figures MemcpyRate(const Args& a, const std::vector<std::vector<uint64_t>>& batches) {
  std::vector<float> table(std::min<uint64_t>(a.vocab, uint64_t{1} << 22) * a.dim, 1.0f);
  std::vector<float> rows(a.batch * a.dim, 2.0f);
  const uint64_t slots = table.size() / a.dim;
  std::vector<double> rates;
  for (int rep = 0; rep < a.reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    size_t done = 0;
    for (const auto& ids : batches) {
      for (size_t i = 0; i < ids.size(); ++i) {
        std::memcpy(table.data() + (ids[i] % slots) * a.dim, rows.data() + i * a.dim,
                    a.dim * sizeof(float));
      }
      done += ids.size();
    }
    rates.push_back(double(done) / Seconds(start));
  }
  if (table[7] == 0.5f) std::printf(" ");  // keeps the copies
  return Summary(rates);
}

void Run(const Args& a) {
  std::vector<std::vector<uint64_t>> batches;
  {
    const std::vector<uint64_t> all = ZipfIds(a.vocab, a.zipf, a.batch * a.batches, 100);
    for (size_t b = 0; b < a.batches; ++b) {
      batches.emplace_back(all.begin() + b * a.batch, all.begin() + (b + 1) * a.batch);
    }
  }
  std::vector<float> grads(a.batch * a.dim);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (float& g : grads) g = normal(rng);
  std::vector<float> out(a.batch * a.dim);
  const Figures copy = MemcpyRate(a, batches);
  std::printf(
      "embedding_bench: dim %u, %zu batches of %zu ids, Zipf(%.2f) over %llu ids, %d reps, "
      "one core\n",
      a.dim, a.batches, a.batch, a.zipf, static_cast<unsigned long long>(a.vocab), a.reps);
  std::printf("  %-8s %-6s %14s %14s %14s %8s\n", "opt", "pass", "median rows/s", "min", "max",
              "/memcpy");
  std::printf("  %-8s %-6s %14.3g %14.3g %14.3g %8s\n", "memcpy", "write", copy.median, copy.min,
              copy.max, "1.00");
  for (RowOptimizerKind kind :
       {RowOptimizerKind::kSgd, RowOptimizerKind::kAdagrad, RowOptimizerKind::kAdam}) {
    EmbeddingOptions o;
    o.optimizer = kind;
    MemoryBudget budget(size_t{16} << 30);
    EmbeddingTable table(0, a.dim, o, &budget);
    uint64_t step = 0;
    for (const auto& ids : batches) table.Apply(ids.data(), ids.size(), grads.data(), step++);
    std::vector<double> apply, pull;
    for (int rep = 0; rep < a.reps; ++rep) {
      auto start = std::chrono::steady_clock::now();
      size_t done = 0;
      for (const auto& ids : batches) {
        table.Apply(ids.data(), ids.size(), grads.data(), step++);
        done += ids.size();
      }
      apply.push_back(double(done) / Seconds(start));
      start = std::chrono::steady_clock::now();
      for (const auto& ids : batches) table.Pull(ids.data(), ids.size(), step, out.data());
      pull.push_back(double(done) / Seconds(start));
    }
    const Figures fa = Summary(apply), fp = Summary(pull);
    const char* name = server::RowOptimizerName(kind);
    std::printf("  %-8s %-6s %14.3g %14.3g %14.3g %8.2f\n", name, "apply", fa.median, fa.min,
                fa.max, fa.median / copy.median);
    std::printf("  %-8s %-6s %14.3g %14.3g %14.3g %8.2f\n", name, "pull", fp.median, fp.min, fp.max,
                fp.median / copy.median);
    std::printf(
        "{\"bench\":\"embedding\",\"optimizer\":\"%s\",\"dim\":%u,\"batch\":%zu,"
        "\"rows\":%llu,\"apply_rows_per_s\":%.0f,\"pull_rows_per_s\":%.0f,"
        "\"memcpy_rows_per_s\":%.0f}\n",
        name, a.dim, a.batch, static_cast<unsigned long long>(table.stats().rows), fa.median,
        fp.median, copy.median);
  }
}

}  // namespace
}  // namespace gradsync::bench

int main(int argc, char** argv) {
  using namespace gradsync;
  auto config = bench::OrDie(Config::FromArgs(argc, argv, nullptr), "flags");
  bench::Args a;
  a.dim = static_cast<uint32_t>(bench::OrDie(config.GetInt("dim", a.dim), "--dim"));
  a.vocab = static_cast<uint64_t>(
      bench::OrDie(config.GetInt("vocab", static_cast<int64_t>(a.vocab)), "--vocab"));
  a.batch = static_cast<size_t>(
      bench::OrDie(config.GetInt("batch", static_cast<int64_t>(a.batch)), "--batch"));
  a.batches = static_cast<size_t>(
      bench::OrDie(config.GetInt("batches", static_cast<int64_t>(a.batches)), "--batches"));
  a.reps = static_cast<int>(bench::OrDie(config.GetInt("reps", a.reps), "--reps"));
  a.zipf = bench::OrDie(config.GetDouble("zipf", a.zipf), "--zipf");
  if (a.dim == 0 || a.vocab == 0 || a.batch == 0 || a.batches == 0 || a.reps < 1)
    bench::Die("bad flags");
  if (Status known = config.CheckKnownFlags(); !known.ok()) bench::Die(known.ToString());
  bench::Run(a);
  return 0;
}
