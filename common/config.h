// Configuration from command-line flags and the environment.
//
// A setting named "num_workers" is read from `--num_workers=4` on the command
// line, else from the environment variable GRADSYNC_NUM_WORKERS, else the
// caller's default. Flags win over the environment. A flag that no component
// asked for is reported by UnknownFlags() and CheckKnownFlags(), so typos
// fail loudly.
//
// Thread-safety: not thread-safe; read the configuration at start-up.
#ifndef GRADSYNC_COMMON_CONFIG_H_
#define GRADSYNC_COMMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace gradsync {

class Config {
 public:
  // Parses `--name=value` flags; a bare `--name` means "true". Arguments not starting with "--" are
  // kept as positional(). `env` holds "NAME=value" strings (as `environ`); null reads nothing.
  static StatusOr<Config> FromArgs(int argc, const char* const* argv, const char* const* env);
  // Flags only, from a map (tests and the C API).
  static Config FromMap(std::map<std::string, std::string> flags);

  // The raw value, flag first, then GRADSYNC_<NAME>.
  std::optional<std::string> Lookup(const std::string& name) const;
  // Typed getters; a value that does not parse is an InvalidArgument error
  // naming the setting, its source and the value.
  StatusOr<std::string> GetString(const std::string& name, const std::string& default_value) const;
  StatusOr<int64_t> GetInt(const std::string& name, int64_t default_value) const;
  StatusOr<double> GetDouble(const std::string& name, double default_value) const;
  StatusOr<bool> GetBool(const std::string& name, bool default_value) const;

  // Flags given on the command line that no getter asked for.
  std::vector<std::string> UnknownFlags() const;
  // OK when every flag was asked for; else InvalidArgument naming each one
  // that was not: "unknown flag --a, --b", with `noun` for "flag". Call it
  // once every component has read its settings.
  Status CheckKnownFlags(const std::string& noun = "flag") const;
  const std::vector<std::string>& positional() const { return positional_; }

  // "GRADSYNC_NUM_WORKERS" for "num_workers".
  static std::string EnvName(const std::string& name);

 private:
  // "--num_workers" or "GRADSYNC_NUM_WORKERS", whichever supplied the value.
  std::string SourceOf(const std::string& name) const;
  Status BadValue(const std::string& name, const std::string& value, const char* expected) const;

  std::map<std::string, std::string> flags_;
  std::map<std::string, std::string> env_;
  std::vector<std::string> positional_;
  mutable std::set<std::string> asked_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CONFIG_H_
