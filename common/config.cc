#include "common/config.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace gradsync {

std::string Config::EnvName(const std::string& name) {
  std::string out = "GRADSYNC_";
  for (char c : name) {
    out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

StatusOr<Config> Config::FromArgs(int argc, const char* const* argv, const char* const* env) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      config.positional_.push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else {
      value = "true";
    }
    for (char& c : name) c = c == '-' ? '_' : c;
    if (name.empty()) return InvalidArgumentError("empty flag name in '" + arg + "'");
    config.flags_[name] = value;
  }
  for (const char* const* e = env; e != nullptr && *e != nullptr; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (kv.rfind("GRADSYNC_", 0) == 0 && eq != std::string::npos) {
      config.env_[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return config;
}

Config Config::FromMap(std::map<std::string, std::string> flags) {
  Config config;
  config.flags_ = std::move(flags);
  return config;
}

std::optional<std::string> Config::Lookup(const std::string& name) const {
  asked_.insert(name);
  auto f = flags_.find(name);
  if (f != flags_.end()) return f->second;
  auto e = env_.find(EnvName(name));
  if (e != env_.end()) return e->second;
  return std::nullopt;
}

std::string Config::SourceOf(const std::string& name) const {
  return flags_.count(name) ? "--" + name : EnvName(name);
}

Status Config::BadValue(const std::string& name, const std::string& value,
                        const char* expected) const {
  return InvalidArgumentError(SourceOf(name) + "='" + value + "' is not " + expected);
}

StatusOr<std::string> Config::GetString(const std::string& name,
                                        const std::string& default_value) const {
  return Lookup(name).value_or(default_value);
}

StatusOr<int64_t> Config::GetInt(const std::string& name, int64_t default_value) const {
  auto v = Lookup(name);
  if (!v) return default_value;
  errno = 0;
  char* end = nullptr;
  long long parsed = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno == ERANGE) {
    return BadValue(name, *v, "an integer");
  }
  return static_cast<int64_t>(parsed);
}

StatusOr<double> Config::GetDouble(const std::string& name, double default_value) const {
  auto v = Lookup(name);
  if (!v) return default_value;
  char* end = nullptr;
  double parsed = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0') return BadValue(name, *v, "a number");
  return parsed;
}

StatusOr<bool> Config::GetBool(const std::string& name, bool default_value) const {
  auto v = Lookup(name);
  if (!v) return default_value;
  if (*v == "1" || *v == "true" || *v == "yes") return true;
  if (*v == "0" || *v == "false" || *v == "no") return false;
  return BadValue(name, *v, "a boolean (true/false)");
}

std::vector<std::string> Config::UnknownFlags() const {
  std::vector<std::string> unknown;
  for (const auto& kv : flags_) {
    if (!asked_.count(kv.first)) unknown.push_back("--" + kv.first);
  }
  return unknown;
}

Status Config::CheckKnownFlags(const std::string& noun) const {
  const std::vector<std::string> unknown = UnknownFlags();
  if (unknown.empty()) return OkStatus();
  std::string names;
  for (const std::string& flag : unknown) names += (names.empty() ? "" : ", ") + flag;
  return InvalidArgumentError("unknown " + noun + " " + names);
}

}  // namespace gradsync
