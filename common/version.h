// Versions that peers compare at registration.
#ifndef GRADSYNC_COMMON_VERSION_H_
#define GRADSYNC_COMMON_VERSION_H_

#include <cstdint>

namespace gradsync {

// Bumped on any incompatible change to wire/gradsync.fbs or its meaning.
// 3: RingData has its own body, the codec string is the one encoding
//    field, and RegisterBody and NodeAddress carry the node's own CURVE
//    public key.
// 4: Gather and Gathered (the workers' all-gathers through the
//    scheduler: ring lanes' and pairs' ports, link times).
constexpr uint32_t kProtocolVersion = 4;
// The release this binary was built from; peers of another build are refused.
constexpr const char* kBuildId = "gradsync-0.1.0";

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_VERSION_H_
