// Server-side optimizers of the parameter server: SGD, momentum SGD and Adam
// over fp32 parameters.
//
// An Optimizer is stateless configuration; the per-parameter state (momentum
// buffer, Adam moments and step count) lives in an OptimizerSlots owned by
// the caller, so a shard keeps one per key and can serialise it.
//
//   sgd:      p -= lr * g
//   momentum: v = momentum * v + g;  p -= lr * v
//   adam:     t += 1; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//             p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//
// `lr_scale` multiplies lr for one step (staleness-aware learning rates).
//
// Thread-safety: an Optimizer is immutable and may be shared; a slots object
// belongs to one caller at a time.
#ifndef GRADSYNC_PS_OPTIMIZER_H_
#define GRADSYNC_PS_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace gradsync::server {

enum class OptimizerKind { kNone, kSgd, kMomentum, kAdam };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kNone;
  float lr = 0.01f;
  float momentum = 0.9f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;

  // Reads optimizer=none|sgd|momentum|adam, lr, momentum, beta1, beta2, eps.
  // InvalidArgument naming the setting for an unknown kind or a value out of
  // range (lr <= 0, momentum or betas outside [0, 1), eps <= 0).
  static StatusOr<OptimizerOptions> FromConfig(const Config& config);
};

const char* OptimizerName(OptimizerKind kind);

// Per-key optimizer state; empty vectors until the first step.
struct OptimizerSlots {
  std::vector<float> velocity;  // momentum
  std::vector<float> m;         // adam first moment
  std::vector<float> v;         // adam second moment
  uint64_t steps = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual OptimizerKind kind() const = 0;
  // params[0, n) takes one step along grad[0, n).
  virtual void Step(float* params, const float* grad, size_t n, OptimizerSlots* slots,
                    float lr_scale) const = 0;
};

// Null for kind kNone (the shard then only aggregates).
std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerOptions& options);

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_OPTIMIZER_H_
