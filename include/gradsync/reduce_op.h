// How a collective combines the ranks' values: part of the public API
// (communicator.h) and of the collectives behind it.
#ifndef GRADSYNC_INCLUDE_GRADSYNC_REDUCE_OP_H_
#define GRADSYNC_INCLUDE_GRADSYNC_REDUCE_OP_H_

namespace gradsync::client {

enum class ReduceOp { kSum, kAverage };

}  // namespace gradsync::client

#endif  // GRADSYNC_INCLUDE_GRADSYNC_REDUCE_OP_H_
