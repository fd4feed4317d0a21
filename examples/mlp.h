// A multilayer perceptron classifier for the examples: fully connected
// layers with ReLU between them and a softmax cross-entropy loss, trained
// with SGD and momentum. The linear algebra is Eigen's.
//
// Parameters live in one contiguous float buffer per tensor, two tensors per
// layer in the order fc1.weight, fc1.bias, fc2.weight, ... . A weight of a
// layer with `in` inputs and `out` outputs is an out x in matrix stored
// column-major (element (o, i) at i * out + o); a bias has `out` elements.
// Each gradient lives in a buffer of the same shape, so that the buffers can
// be handed to a gradient synchroniser (client::Communicator::MarkReady) as
// they are.
//
// Thread-safety: not thread-safe; one thread drives a model, except that a
// gradient buffer handed out by Backward's callback may be read and written
// by another thread until the next Forward.
#ifndef GRADSYNC_EXAMPLES_MLP_H_
#define GRADSYNC_EXAMPLES_MLP_H_

#include <Eigen/Dense>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gradsync::examples {

class Mlp {
 public:
  // `layer_sizes` = {inputs, hidden..., classes}, at least two entries, all
  // positive. Weights are drawn from N(0, 2 / fan_in) (He) by a generator
  // seeded with `seed`; biases start at zero. Equal seeds give equal models.
  Mlp(std::vector<int> layer_sizes, uint64_t seed);

  size_t num_tensors() const { return 2 * weights_.size(); }
  const std::vector<int>& layer_sizes() const { return sizes_; }
  // "fc<layer>.weight" or "fc<layer>.bias", layers counted from 1.
  std::string tensor_name(size_t tensor) const;
  size_t tensor_size(size_t tensor) const;
  float* param(size_t tensor);
  const float* param(size_t tensor) const;
  float* grad(size_t tensor);
  size_t num_parameters() const;

  // Runs the batch and returns the mean cross-entropy loss. `inputs` holds
  // `batch` samples of layer_sizes()[0] floats each, sample after sample;
  // every label is below the number of classes. Keeps what Backward needs.
  float Forward(const float* inputs, const uint8_t* labels, int batch);

  // Writes the gradient of the last Forward's loss into every gradient
  // buffer, from the last layer to the first, and calls `on_ready(tensor)`
  // as soon as a buffer is final: bias then weight of the last layer, then
  // of the layer before, and so on. Gradients are overwritten, not added.
  void Backward(const std::function<void(size_t tensor)>& on_ready);

  // How many of the `batch` samples get their label as the arg-max class.
  int CountCorrect(const float* inputs, const uint8_t* labels, int batch) const;

 private:
  // Logits of `x` (one sample per column); fills `activations` with each
  // layer's input when it is not null.
  Eigen::MatrixXf Logits(const Eigen::MatrixXf& x, std::vector<Eigen::MatrixXf>* activations) const;

  std::vector<int> sizes_;
  std::vector<Eigen::MatrixXf> weights_;
  std::vector<Eigen::VectorXf> biases_;
  std::vector<Eigen::MatrixXf> weight_grads_;
  std::vector<Eigen::VectorXf> bias_grads_;
  std::vector<Eigen::MatrixXf> activations_;  // input of each layer, last Forward
  Eigen::MatrixXf probs_;                     // softmax output, last Forward
  std::vector<uint8_t> labels_;
};

// SGD with momentum in PyTorch's form: v = momentum * v + g; p -= lr * v.
// Holds one velocity buffer per tensor of the model it was built for.
class SgdMomentum {
 public:
  SgdMomentum(const Mlp& model, float lr, float momentum);
  // Applies the model's current gradients to its parameters.
  void Step(Mlp* model);
  // The velocity of tensor `tensor` (as many floats as the tensor).
  float* velocity(size_t tensor) { return velocity_[tensor].data(); }

 private:
  float lr_;
  float momentum_;
  std::vector<Eigen::VectorXf> velocity_;
};

}  // namespace gradsync::examples

#endif  // GRADSYNC_EXAMPLES_MLP_H_
