#include "ps/optimizer.h"

#include <cmath>

namespace gradsync::server {
namespace {

class Sgd : public Optimizer {
 public:
  explicit Sgd(float lr) : lr_(lr) {}
  OptimizerKind kind() const override { return OptimizerKind::kSgd; }
  void Step(float* p, const float* g, size_t n, OptimizerSlots* slots,
            float lr_scale) const override {
    const float lr = lr_ * lr_scale;
    for (size_t i = 0; i < n; ++i) p[i] -= lr * g[i];
    slots->steps++;
  }

 private:
  const float lr_;
};

class Momentum : public Optimizer {
 public:
  Momentum(float lr, float momentum) : lr_(lr), momentum_(momentum) {}
  OptimizerKind kind() const override { return OptimizerKind::kMomentum; }
  void Step(float* p, const float* g, size_t n, OptimizerSlots* s, float lr_scale) const override {
    if (s->velocity.size() != n) s->velocity.assign(n, 0.0f);
    const float lr = lr_ * lr_scale;
    float* v = s->velocity.data();
    for (size_t i = 0; i < n; ++i) {
      v[i] = momentum_ * v[i] + g[i];
      p[i] -= lr * v[i];
    }
    s->steps++;
  }

 private:
  const float lr_, momentum_;
};

class Adam : public Optimizer {
 public:
  explicit Adam(const OptimizerOptions& o) : lr_(o.lr), b1_(o.beta1), b2_(o.beta2), eps_(o.eps) {}
  OptimizerKind kind() const override { return OptimizerKind::kAdam; }
  void Step(float* p, const float* g, size_t n, OptimizerSlots* s, float lr_scale) const override {
    if (s->m.size() != n) s->m.assign(n, 0.0f);
    if (s->v.size() != n) s->v.assign(n, 0.0f);
    s->steps++;
    const float t = static_cast<float>(s->steps);
    const float c1 = 1.0f - std::pow(b1_, t);
    const float c2 = 1.0f - std::pow(b2_, t);
    const float lr = lr_ * lr_scale;
    float* m = s->m.data();
    float* v = s->v.data();
    for (size_t i = 0; i < n; ++i) {
      m[i] = b1_ * m[i] + (1.0f - b1_) * g[i];
      v[i] = b2_ * v[i] + (1.0f - b2_) * g[i] * g[i];
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps_);
    }
  }

 private:
  const float lr_, b1_, b2_, eps_;
};

StatusOr<OptimizerKind> ParseKind(const std::string& name) {
  if (name == "none") return OptimizerKind::kNone;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  return InvalidArgumentError("optimizer must be none, sgd, momentum or adam, got '" + name + "'");
}

}  // namespace

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kNone:
      return "none";
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "invalid";
}

StatusOr<OptimizerOptions> OptimizerOptions::FromConfig(const Config& config) {
  OptimizerOptions o;
  GS_ASSIGN_OR_RETURN(std::string name, config.GetString("optimizer", "none"));
  GS_ASSIGN_OR_RETURN(o.kind, ParseKind(name));
  GS_ASSIGN_OR_RETURN(double lr, config.GetDouble("lr", o.lr));
  GS_ASSIGN_OR_RETURN(double momentum, config.GetDouble("momentum", o.momentum));
  GS_ASSIGN_OR_RETURN(double beta1, config.GetDouble("beta1", o.beta1));
  GS_ASSIGN_OR_RETURN(double beta2, config.GetDouble("beta2", o.beta2));
  GS_ASSIGN_OR_RETURN(double eps, config.GetDouble("eps", o.eps));
  if (!(lr > 0)) return InvalidArgumentError("lr must be positive, got " + std::to_string(lr));
  for (auto [name, value] : {std::pair{"momentum", momentum}, {"beta1", beta1}, {"beta2", beta2}}) {
    if (!(value >= 0 && value < 1)) {
      return InvalidArgumentError(std::string(name) + " must be in [0, 1), got " +
                                  std::to_string(value));
    }
  }
  if (!(eps > 0)) return InvalidArgumentError("eps must be positive, got " + std::to_string(eps));
  o.lr = static_cast<float>(lr);
  o.momentum = static_cast<float>(momentum);
  o.beta1 = static_cast<float>(beta1);
  o.beta2 = static_cast<float>(beta2);
  o.eps = static_cast<float>(eps);
  return o;
}

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerOptions& options) {
  switch (options.kind) {
    case OptimizerKind::kNone:
      return nullptr;
    case OptimizerKind::kSgd:
      return std::make_unique<Sgd>(options.lr);
    case OptimizerKind::kMomentum:
      return std::make_unique<Momentum>(options.lr, options.momentum);
    case OptimizerKind::kAdam:
      return std::make_unique<Adam>(options);
  }
  return nullptr;
}

}  // namespace gradsync::server
