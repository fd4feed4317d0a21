#include "ps/job_codec.h"

#include "compression/registry.h"

namespace gradsync::server {
namespace {

std::string NameOf(const std::string& spec) { return spec.substr(0, spec.find(':')); }

void AddName(const std::string& spec, std::set<std::string>* names) {
  const std::string name = NameOf(spec);
  if (!name.empty() && name != "none") names->insert(name);
}

std::string Quoted(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

}  // namespace

JobCodec::JobCodec(const std::string& spec, const std::string& overrides) {
  AddName(spec, &configured_);
  for (const auto& entry : compression::ParseCompressionOverrides(overrides)) {
    AddName(entry.second, &configured_);
  }
}

std::string JobCodec::FixedLocked(uint32_t bucket) const {
  auto it = fixed_.find(bucket);
  if (it != fixed_.end()) return it->second;
  return configured_.size() == 1 ? *configured_.begin() : std::string();
}

Status JobCodec::Admit(const std::string& codec, int32_t worker, uint32_t bucket) const {
  const std::string name = NameOf(codec);
  if (!configured_.empty() && configured_.count(name) == 0) {
    return InvalidArgumentError("is compressed with \"" + name + "\", this job's pushes with " +
                                (configured_.size() == 1 ? "" : "one of ") + Quoted(configured_));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string fixed = FixedLocked(bucket);
  if (fixed.empty()) {
    if (worker == 0) return OkStatus();
    return UnavailableError("waits for worker 0's first compressed push of bucket " +
                            std::to_string(bucket) +
                            ", which fixes its compressor; send it "
                            "again later");
  }
  if (name == fixed) return OkStatus();
  return InvalidArgumentError("is compressed with \"" + name + "\", this job's pushes of bucket " +
                              std::to_string(bucket) + " with \"" + fixed + "\"");
}

void JobCodec::Taken(const std::string& codec, int32_t worker, uint32_t bucket) {
  if (worker != 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (FixedLocked(bucket).empty()) fixed_[bucket] = NameOf(codec);
}

std::string JobCodec::name(uint32_t bucket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return FixedLocked(bucket);
}

}  // namespace gradsync::server
