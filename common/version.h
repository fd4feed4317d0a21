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
// 5: one field, one meaning: Header.epoch (the membership epoch, no longer
//    in Header.step's upper half or EmbeddingBody), barrier ids counted per
//    epoch (0: the epoch's membership barrier), the ring collective's number
//    in RingDataBody/RingAbortBody.collective (Header.seq is a request's
//    number only), DataBody.version split into base_version (requests) and
//    key_version (answers).
constexpr uint32_t kProtocolVersion = 5;
// The release this binary was built from; peers of another build are refused.
constexpr const char* kBuildId = "gradsync-0.1.0";

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_VERSION_H_
