#include "compression/registry.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "compression/error_feedback.h"
#include "compression/half_compressor.h"
#include "compression/none_compressor.h"
#include "compression/qsgd_compressor.h"
#include "compression/randomk_compressor.h"
#include "compression/sign_compressor.h"
#include "compression/topk_compressor.h"

namespace gradsync::compression {
namespace {

constexpr char kEf[] = "ef";
constexpr char kMomentum[] = "momentum";
constexpr char kWarmup[] = "warmup";
constexpr char kPowerSgd[] = "powersgd";  // PowerSgd::kName

Status BadSpec(const std::string& spec, const std::string& why) {
  return InvalidArgumentError("compressor spec \"" + spec + "\": " + why);
}

bool ParseDouble(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(text.c_str(), &end);
  return errno == 0 && end == text.c_str() + text.size();
}

bool ParseUnsigned(const std::string& text, unsigned long long* out) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtoull(text.c_str(), &end, 10);
  return errno == 0 && end == text.c_str() + text.size();
}

// Sets the option `key` from `value`; false if the value does not parse.
// Ranges are left to the factories.
bool SetOption(const std::string& key, const std::string& value, CompressorOptions* options) {
  unsigned long long u = 0;
  if (key == "ratio") return ParseDouble(value, &options->ratio);
  if (key == "chunk" && ParseUnsigned(value, &u)) {
    options->chunk = static_cast<size_t>(u);
    return u == options->chunk;
  }
  if (key == "levels" && ParseUnsigned(value, &u)) {
    options->levels = static_cast<int>(std::min<unsigned long long>(u, 1000));
    return true;
  }
  if (key == "rank" && ParseUnsigned(value, &u)) {
    options->rank = static_cast<int>(std::min<unsigned long long>(u, 1000));
    return true;
  }
  if (key == kMomentum) return ParseDouble(value, &options->momentum);
  if (key == kWarmup && ParseUnsigned(value, &u)) {
    options->warmup = static_cast<uint64_t>(u);
    return true;
  }
  if (key == kEf && (value == "0" || value == "1")) {
    options->error_feedback = value == "1";
    return true;
  }
  return false;
}

bool IsKnownKey(const std::string& key) {
  return key == "ratio" || key == "chunk" || key == "levels" || key == "rank" || key == kEf ||
         key == kMomentum || key == kWarmup;
}

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

template <typename T>
StatusOr<std::unique_ptr<Compressor>> Upcast(StatusOr<std::unique_ptr<T>> made) {
  if (!made.ok()) return made.status();
  return std::unique_ptr<Compressor>(std::move(made).value());
}

}  // namespace

std::map<std::string, std::string> ParseCompressionOverrides(const std::string& list) {
  std::map<std::string, std::string> out;
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(';', start);
    if (end == std::string::npos) end = list.size();
    const std::string entry = list.substr(start, end - start);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) {
      out[entry.substr(0, eq)] = entry.substr(eq + 1);
    } else if (!entry.empty()) {
      out[entry] = "";
    }
    start = end + 1;
  }
  return out;
}

StatusOr<CompressorSpec> ParseCompressorSpec(const std::string& spec) {
  CompressorSpec parsed;
  const size_t colon = spec.find(':');
  parsed.name = spec.substr(0, colon);
  if (parsed.name.empty()) return BadSpec(spec, "no compressor name");
  if (colon == std::string::npos) return parsed;
  size_t start = colon + 1;
  while (true) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string item = spec.substr(start, comma - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return BadSpec(spec, "\"" + item + "\" is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!IsKnownKey(key)) return BadSpec(spec, "unknown option \"" + key + "\"");
    if (std::count(parsed.keys.begin(), parsed.keys.end(), key) > 0) {
      return BadSpec(spec, "option \"" + key + "\" given twice");
    }
    if (!SetOption(key, value, &parsed.options)) {
      return BadSpec(spec, "bad value \"" + value + "\" for \"" + key + "\"");
    }
    parsed.keys.push_back(key);
    parsed.values.push_back(value);
    if (comma == spec.size()) return parsed;
    start = comma + 1;
  }
}

Status CompressorRegistry::Register(std::string name, Factory factory) {
  if (!factory) {
    return InvalidArgumentError("compressor \"" + name + "\" has no factory");
  }
  return RegisterWithOptions(
      std::move(name), {},
      [factory](const CompressorOptions&) -> StatusOr<std::unique_ptr<Compressor>> {
        return factory();
      });
}

Status CompressorRegistry::RegisterWithOptions(std::string name, std::vector<std::string> keys,
                                               OptionsFactory factory) {
  if (name.empty()) return InvalidArgumentError("compressor name is empty");
  if (name.find_first_of(":,=") != std::string::npos) {
    return InvalidArgumentError("compressor name \"" + name + "\" contains one of ':', ',', '='");
  }
  if (!factory) {
    return InvalidArgumentError("compressor \"" + name + "\" has no factory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.count(name) > 0) {
    return AlreadyExistsError("compressor \"" + name + "\" is already registered");
  }
  entries_.emplace(std::move(name), Entry{std::move(keys), std::move(factory)});
  return OkStatus();
}

StatusOr<std::unique_ptr<Compressor>> CompressorRegistry::Create(const std::string& spec) const {
  GS_ASSIGN_OR_RETURN(CompressorSpec parsed, ParseCompressorSpec(spec));
  Entry entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(parsed.name);
    if (it != entries_.end()) entry = it->second;
  }
  if (!entry.factory && parsed.name == kPowerSgd) {
    return NotFoundError(
        "compressor \"powersgd\" is not a byte compressor: it runs on the "
        "all-reduce path (compression/powersgd.h)");
  }
  if (!entry.factory) {
    return NotFoundError("unknown compressor \"" + parsed.name + "\"; known: [" +
                         JoinKeys(Names()) + "]");
  }
  for (const std::string& key : parsed.keys) {
    if (key != kEf && std::count(entry.keys.begin(), entry.keys.end(), key) == 0) {
      return BadSpec(spec, "compressor \"" + parsed.name + "\" takes no option \"" + key +
                               "\" (it takes: [" + JoinKeys(entry.keys) + "])");
    }
  }
  StatusOr<std::unique_ptr<Compressor>> made = entry.factory(parsed.options);
  if (!made.ok()) return made.status().WithPrefix("compressor spec \"" + spec + "\"");
  if (*made == nullptr) {
    return InternalError("factory of compressor \"" + parsed.name + "\" returned null");
  }
  const bool momentum_given = std::count(parsed.keys.begin(), parsed.keys.end(), kMomentum) > 0;
  if (momentum_given && !parsed.options.error_feedback) {
    return BadSpec(spec, "momentum is part of the error feedback: it needs ef=1");
  }
  if (!(parsed.options.momentum >= 0 && parsed.options.momentum < 1)) {
    return BadSpec(spec, "momentum must be in [0, 1)");
  }
  if (!parsed.options.error_feedback) return made;
  return std::unique_ptr<Compressor>(std::make_unique<ErrorFeedback>(
      std::move(made).value(), static_cast<float>(parsed.options.momentum)));
}

std::vector<std::string> CompressorRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& entry : entries_) names.push_back(entry.first);
  return names;
}

void RegisterBuiltins(CompressorRegistry* registry) {
  // AlreadyExists on a second call is fine: the builtins are there.
  registry->Register(NoneCompressor::kName, [] { return std::make_unique<NoneCompressor>(); })
      .IgnoreError();
  for (HalfFormat f : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    auto make = [f] { return std::make_unique<HalfCompressor>(f); };
    registry->Register(make()->name(), make).IgnoreError();
  }
  for (TopKMethod m : {TopKMethod::kExact, TopKMethod::kSampled}) {
    for (TopKValues v : {TopKValues::kFp32, TopKValues::kFp16}) {
      auto make = [m, v](const CompressorOptions& o) {
        return Upcast(TopKCompressor::Create(m, v, o.ratio, o.warmup));
      };
      const std::string name = TopKCompressor::Create(m, v, 0.01).value()->name();
      registry->RegisterWithOptions(name, {"ratio", kMomentum, kWarmup}, make).IgnoreError();
    }
  }
  registry
      ->RegisterWithOptions(
          RandomKCompressor::kName, {"ratio", kMomentum},
          [](const CompressorOptions& o) {
            // Unbiased scaling and error feedback do
            // not mix (randomk_compressor.h).
            return Upcast(RandomKCompressor::Create(o.ratio, /*unbiased=*/!o.error_feedback));
          })
      .IgnoreError();
  registry
      ->RegisterWithOptions(
          SignCompressor::kName, {"chunk"},
          [](const CompressorOptions& o) { return Upcast(SignCompressor::Create(o.chunk)); })
      .IgnoreError();
  registry
      ->RegisterWithOptions(QsgdCompressor::kName, {"chunk", "levels"},
                            [](const CompressorOptions& o) {
                              return Upcast(QsgdCompressor::Create(o.chunk, o.levels));
                            })
      .IgnoreError();
}

}  // namespace gradsync::compression
