// CompressorRegistry: maps compressor names to factories.
//
// There is no global registry and no static registration: the owner of a
// Communicator or server builds a registry, calls RegisterBuiltins (and
// registers its own compressors), and passes it in.
//
// Errors: Register returns AlreadyExists for a name taken before and
// InvalidArgument for an empty name or factory; Create returns NotFound,
// listing the known names, for an unknown name.
//
// Thread-safety: all methods may be called concurrently (an internal mutex).
// Each Create call returns a fresh instance, owned by the caller, so every
// thread can have its own.
#ifndef GRADSYNC_COMPRESSION_REGISTRY_H_
#define GRADSYNC_COMPRESSION_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync {
namespace compression {

class CompressorRegistry {
 public:
  // Returns a new compressor; never null.
  using Factory = std::function<std::unique_ptr<Compressor>()>;

  CompressorRegistry() = default;
  CompressorRegistry(const CompressorRegistry&) = delete;
  CompressorRegistry& operator=(const CompressorRegistry&) = delete;

  Status Register(std::string name, Factory factory);

  // A new instance of the compressor registered as `name`. Internal error if
  // the factory returns null.
  StatusOr<std::unique_ptr<Compressor>> Create(const std::string& name) const;

  // The registered names, sorted.
  std::vector<std::string> Names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Factory> factories_;  // Guarded by mu_.
};

// Registers the compressors that ship with gradsync ("none"). Call it once
// per registry; a second call leaves the registry unchanged.
void RegisterBuiltins(CompressorRegistry* registry);

}  // namespace compression
}  // namespace gradsync

#endif  // GRADSYNC_COMPRESSION_REGISTRY_H_
