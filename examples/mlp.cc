#include "examples/mlp.h"

#include <cmath>
#include <random>

namespace gradsync::examples {

using Eigen::MatrixXf;
using Eigen::VectorXf;

Mlp::Mlp(std::vector<int> layer_sizes, uint64_t seed) : sizes_(std::move(layer_sizes)) {
  std::mt19937_64 rng(seed);
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    const int in = sizes_[l], out = sizes_[l + 1];
    std::normal_distribution<float> normal(0.0f, std::sqrt(2.0f / static_cast<float>(in)));
    weights_.push_back(MatrixXf::NullaryExpr(out, in, [&] { return normal(rng); }));
    biases_.push_back(VectorXf::Zero(out));
    weight_grads_.push_back(MatrixXf::Zero(out, in));
    bias_grads_.push_back(VectorXf::Zero(out));
  }
}

std::string Mlp::tensor_name(size_t tensor) const {
  return "fc" + std::to_string(tensor / 2 + 1) + (tensor % 2 == 0 ? ".weight" : ".bias");
}

size_t Mlp::tensor_size(size_t tensor) const {
  const size_t l = tensor / 2;
  return static_cast<size_t>(tensor % 2 == 0 ? weights_[l].size() : biases_[l].size());
}

float* Mlp::param(size_t tensor) {
  return tensor % 2 == 0 ? weights_[tensor / 2].data() : biases_[tensor / 2].data();
}

const float* Mlp::param(size_t tensor) const {
  return tensor % 2 == 0 ? weights_[tensor / 2].data() : biases_[tensor / 2].data();
}

float* Mlp::grad(size_t tensor) {
  return tensor % 2 == 0 ? weight_grads_[tensor / 2].data() : bias_grads_[tensor / 2].data();
}

size_t Mlp::num_parameters() const {
  size_t n = 0;
  for (size_t t = 0; t < num_tensors(); ++t) n += tensor_size(t);
  return n;
}

MatrixXf Mlp::Logits(const MatrixXf& x, std::vector<MatrixXf>* activations) const {
  if (activations != nullptr) activations->assign(1, x);
  MatrixXf a = x;
  for (size_t l = 0; l < weights_.size(); ++l) {
    MatrixXf z = weights_[l] * a;
    z.colwise() += biases_[l];
    if (l + 1 == weights_.size()) return z;
    a = z.cwiseMax(0.0f);
    if (activations != nullptr) activations->push_back(a);
  }
  return a;
}

float Mlp::Forward(const float* inputs, const uint8_t* labels, int batch) {
  const MatrixXf x = Eigen::Map<const MatrixXf>(inputs, sizes_.front(), batch);
  const MatrixXf logits = Logits(x, &activations_);
  // Softmax per column, shifted by the column maximum for stability.
  probs_ = (logits.rowwise() - logits.colwise().maxCoeff()).array().exp().matrix();
  probs_.array().rowwise() /= probs_.colwise().sum().array();
  labels_.assign(labels, labels + batch);
  double loss = 0;
  for (int j = 0; j < batch; ++j) {
    loss -= std::log(std::max(probs_(labels_[j], j), 1e-30f));
  }
  return static_cast<float>(loss / batch);
}

void Mlp::Backward(const std::function<void(size_t)>& on_ready) {
  const int batch = static_cast<int>(labels_.size());
  MatrixXf delta = probs_;  // d loss / d logits = (softmax - one_hot) / batch
  for (int j = 0; j < batch; ++j) delta(labels_[j], j) -= 1.0f;
  delta /= static_cast<float>(batch);
  for (size_t l = weights_.size(); l-- > 0;) {
    bias_grads_[l].noalias() = delta.rowwise().sum();
    if (on_ready) on_ready(2 * l + 1);
    weight_grads_[l].noalias() = delta * activations_[l].transpose();
    if (on_ready) on_ready(2 * l);
    if (l == 0) break;
    const MatrixXf back = weights_[l].transpose() * delta;
    delta = back.cwiseProduct((activations_[l].array() > 0.0f).cast<float>().matrix());
  }
}

int Mlp::CountCorrect(const float* inputs, const uint8_t* labels, int batch) const {
  const MatrixXf x = Eigen::Map<const MatrixXf>(inputs, sizes_.front(), batch);
  const MatrixXf logits = Logits(x, nullptr);
  int correct = 0;
  for (int j = 0; j < batch; ++j) {
    Eigen::Index best = 0;
    logits.col(j).maxCoeff(&best);
    correct += best == labels[j] ? 1 : 0;
  }
  return correct;
}

SgdMomentum::SgdMomentum(const Mlp& model, float lr, float momentum)
    : lr_(lr), momentum_(momentum) {
  for (size_t t = 0; t < model.num_tensors(); ++t) {
    velocity_.push_back(VectorXf::Zero(static_cast<Eigen::Index>(model.tensor_size(t))));
  }
}

void SgdMomentum::Step(Mlp* model) {
  for (size_t t = 0; t < velocity_.size(); ++t) {
    const auto n = static_cast<Eigen::Index>(model->tensor_size(t));
    Eigen::Map<VectorXf> p(model->param(t), n);
    Eigen::Map<const VectorXf> g(model->grad(t), n);
    velocity_[t] = momentum_ * velocity_[t] + g;
    p -= lr_ * velocity_[t];
  }
}

}  // namespace gradsync::examples
