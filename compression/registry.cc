#include "compression/registry.h"

#include <utility>

#include "compression/none_compressor.h"

namespace gradsync {
namespace compression {

Status CompressorRegistry::Register(std::string name, Factory factory) {
  if (name.empty()) return InvalidArgumentError("compressor name is empty");
  if (!factory) {
    return InvalidArgumentError("compressor \"" + name + "\" has no factory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (factories_.count(name) > 0) {
    return AlreadyExistsError("compressor \"" + name +
                              "\" is already registered");
  }
  factories_.emplace(std::move(name), std::move(factory));
  return OkStatus();
}

StatusOr<std::unique_ptr<Compressor>> CompressorRegistry::Create(
    const std::string& name) const {
  Factory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = factories_.find(name);
    if (it != factories_.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const std::string& n : Names())
      known += (known.empty() ? "" : ", ") + n;
    return NotFoundError("unknown compressor \"" + name + "\"; known: [" +
                         known + "]");
  }
  std::unique_ptr<Compressor> compressor = factory();
  if (compressor == nullptr) {
    return InternalError("factory of compressor \"" + name +
                         "\" returned null");
  }
  return compressor;
}

std::vector<std::string> CompressorRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  names.reserve(factories_.size());
  for (const auto& entry : factories_) names.push_back(entry.first);
  return names;
}

void RegisterBuiltins(CompressorRegistry* registry) {
  // AlreadyExists on a second call is fine: the builtins are there.
  registry
      ->Register(NoneCompressor::kName,
                 [] { return std::make_unique<NoneCompressor>(); })
      .IgnoreError();
}

}  // namespace compression
}  // namespace gradsync
