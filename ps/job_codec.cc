#include "ps/job_codec.h"

namespace gradsync::server {
namespace {

std::string NameOf(const std::string& spec) { return spec.substr(0, spec.find(':')); }

}  // namespace

JobCodec::JobCodec(const std::string& spec) : name_(NameOf(spec)) {}

Status JobCodec::Admit(const std::string& codec, int32_t worker) const {
  const std::string name = NameOf(codec);
  std::lock_guard<std::mutex> lock(mu_);
  if (name_.empty() && worker != 0) {
    return UnavailableError(
        "waits for worker 0's first compressed push, which fixes the "
        "job's compressor; send it again later");
  }
  if (name_.empty() || name == name_) return OkStatus();
  return InvalidArgumentError("is compressed with \"" + name + "\", this job's pushes with \"" +
                              name_ + "\"");
}

void JobCodec::Taken(const std::string& codec, int32_t worker) {
  std::lock_guard<std::mutex> lock(mu_);
  if (name_.empty() && worker == 0) name_ = NameOf(codec);
}

std::string JobCodec::name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return name_;
}

}  // namespace gradsync::server
