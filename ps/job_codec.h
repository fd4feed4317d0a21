// JobCodec: the one compressor a shard's compressed pushes may name. A push
// of a job compressed with "topk:ratio=0.01,ef=1" names "topk" (whatever
// ratio its partition states); one naming any other compressor is refused
// before its payload is looked at, so a peer reaches no decoder but the
// job's. The compressor is the shard's `compression` setting (the same one
// the workers read: GRADSYNC_COMPRESSION set for the whole job reaches both);
// left unset, worker 0's first compressed push that the shard takes (one
// that decodes) fixes it for the shard's life: another worker's compressed
// pushes wait for it (they are answered Busy and sent again), so no other
// member of the job can choose the job's compressor by pushing first.
// Uncompressed pushes are always taken (small buckets travel uncompressed).
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_PS_JOB_CODEC_H_
#define GRADSYNC_PS_JOB_CODEC_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "common/status.h"

namespace gradsync::server {

class JobCodec {
 public:
  // `spec`: a compressor spec or name ("topk:ratio=0.01", "none"); empty:
  // worker 0's first compressed push decides.
  explicit JobCodec(const std::string& spec = "");

  // OK when `codec` (a push's codec spec, from worker `worker`) names the
  // job's compressor, or none is fixed yet and the push is worker 0's;
  // Unavailable (push it again later) when none is fixed yet and it is
  // another worker's; InvalidArgument naming both codecs otherwise.
  Status Admit(const std::string& codec, int32_t worker) const;
  // A push of worker `worker` compressed with `codec` was taken: fixes the
  // job's compressor if none is yet and the push is worker 0's.
  void Taken(const std::string& codec, int32_t worker);
  // The job's compressor name; empty while none is fixed.
  std::string name() const;

 private:
  mutable std::mutex mu_;
  std::string name_;  // guarded by mu_
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_JOB_CODEC_H_
