#include "spanformer/nn/gumbel.h"

#include "spanformer/util/error.h"

namespace spanformer::nn {

torch::Tensor gumbel_noise(at::IntArrayRef sizes, const at::TensorOptions& options) {
  auto u = torch::rand(sizes, options).clamp_(1e-20, 1.0 - 5.96e-8);
  return -torch::log(-torch::log(u));
}

torch::Tensor one_hot_argmax(const torch::Tensor& x) {
  auto idx = x.argmax(-1, /*keepdim=*/true);
  return torch::zeros_like(x).scatter_(-1, idx, 1.0);
}

torch::Tensor gumbel_softmax(const torch::Tensor& logits, double tau, bool hard) {
  return gumbel_softmax(logits, gumbel_noise(logits.sizes(), logits.options()), tau, hard);
}

torch::Tensor gumbel_softmax(const torch::Tensor& logits, const torch::Tensor& noise, double tau, bool hard) {
  if (!(tau > 0)) fail("Gumbel-softmax temperature must be positive (got {})", tau);
  auto y = torch::softmax((logits + noise) / tau, -1);
  if (!hard) return y;
  return one_hot_argmax(y.detach()) - y.detach() + y;
}

}  // namespace spanformer::nn
