// Attention pooling, the textbook's first attention (d2l.ai section 11.2): a prediction at query x is a
// weighted average of the training targets y_i, with weights a softmax of how close x is to each key
// x_i (Nadaraya 1964, Watson 1964: kernel regression is attention).
//
//   average        f(x) = (1 / n) sum_i y_i                                    (the weights ignore x)
//   nadaraya       f(x) = sum_i softmax_i(-(x - x_i)^2 / (2 sigma^2)) y_i        Gaussian kernel, width sigma
//   parametric     f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i             w learned (w = 1 / sigma)
//
// Dims: Q queries, n keys (shared by every query, or per query: (Q, n) for leave-one-out training).
// Invariants: every row of weights sums to 1; a constant y is reproduced exactly; as sigma -> 0 the
// prediction at a key x_i tends to y_i, as sigma -> inf to the average.
#pragma once
#include <torch/nn/module.h>

namespace spanformer::nn {

enum class Pooling { kAverage, kNadaraya, kParametric };
const char* pooling_name(Pooling p);

// Weights (Q, n) of queries (Q) over keys (n) or (Q, n), for a kernel of inverse width w (a double or a
// one-element tensor: differentiable in w). Average: 1 / n everywhere.
torch::Tensor pooling_weights(Pooling kind, const torch::Tensor& queries, const torch::Tensor& keys,
                              const torch::Tensor& w);

// The parametric pooling's one parameter w.
class ParametricPoolingImpl : public torch::nn::Module {
 public:
  explicit ParametricPoolingImpl(double w0 = 1.0);
  // queries (Q), keys (n) or (Q, n), values like keys -> (Q); `weights` receives (Q, n) when given.
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
                        torch::Tensor* weights = nullptr);
  torch::Tensor w;
};
TORCH_MODULE(ParametricPooling);

// Leave-one-out training of w on (x, y) (n each): each x_i is a query over the other n - 1 pairs; plain
// gradient descent on the mean squared error, `epochs` full-batch steps of rate lr. Returns the loss
// after each step.
std::vector<double> fit_parametric_pooling(ParametricPoolingImpl& pooling, const torch::Tensor& x, const torch::Tensor& y,
                                           int64_t epochs, double lr);

}  // namespace spanformer::nn
