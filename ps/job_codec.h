// JobCodec: the compressors a shard's compressed pushes may name. A push
// compressed with "topk:ratio=0.01,ef=1" names "topk" (whatever ratio its
// partition states); one naming another compressor than its bucket's is
// refused before its payload is looked at, so a peer reaches no decoder but
// the ones the job uses.
//
// Each bucket has one compressor (a job can give buckets different ones
// through compression_overrides). Configured (the shard's `compression` and
// `compression_overrides` settings, the same ones the workers read: set for
// the whole job they reach both), a push must name one of the configured
// compressors. A bucket's compressor is fixed by worker 0's first compressed
// push of it that the shard takes (one that decodes), or at once when only
// one compressor is configured; until then another worker's compressed
// pushes of the bucket wait for it (they are answered Busy and sent again),
// so no other member of the job can choose a bucket's compressor by pushing
// first. Uncompressed pushes are always taken (small buckets travel
// uncompressed). The buckets it remembers are those of pushes the key
// tables took, which max_keys bounds.
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_PS_JOB_CODEC_H_
#define GRADSYNC_PS_JOB_CODEC_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "common/status.h"

namespace gradsync::server {

class JobCodec {
 public:
  // `spec`: a compressor spec or name ("topk:ratio=0.01", "none");
  // `overrides`: compression_overrides ("KEY=SPEC;KEY=SPEC"). Both empty (or
  // "none"): nothing configured, worker 0's pushes decide.
  explicit JobCodec(const std::string& spec = "", const std::string& overrides = "");

  // OK when `codec` (the codec spec of worker `worker`'s push of bucket
  // `bucket`) names the bucket's compressor, or none is fixed yet and the
  // push is worker 0's of a configured compressor; Unavailable (push it
  // again later) when none is fixed yet and it is another worker's;
  // InvalidArgument naming the codecs otherwise.
  Status Admit(const std::string& codec, int32_t worker, uint32_t bucket) const;
  // A push of worker `worker` of bucket `bucket` compressed with `codec` was
  // taken: fixes the bucket's compressor if none is yet and the push is
  // worker 0's.
  void Taken(const std::string& codec, int32_t worker, uint32_t bucket);
  // The compressor of `bucket`; empty while none is fixed.
  std::string name(uint32_t bucket) const;

 private:
  std::string FixedLocked(uint32_t bucket) const;

  std::set<std::string> configured_;  // compressor names; empty: not configured
  mutable std::mutex mu_;
  std::map<uint32_t, std::string> fixed_;  // guarded by mu_
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_JOB_CODEC_H_
