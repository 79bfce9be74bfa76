// Gumbel-softmax (Jang et al. 2017; Maddison et al. 2017), as the PAR super-network uses it.
//
//   g = -log(-log(U)),  U ~ Uniform(0, 1) clamped to [1e-20, 1 - 2^-24]  (finite for every draw)
//   y = softmax((alpha + g) / tau)                                        along the last dimension
//   hard: y_hard = one_hot(argmax y) - stop_gradient(y) + y  (one-hot forward, soft gradient)
//
// argmax(alpha + g) is distributed as softmax(alpha) whatever tau (the Gumbel-max trick), so hard
// samples pick candidate k with probability softmax(alpha)_k. tau must be positive (no tau = 0).
#pragma once
#include <ATen/ATen.h>

namespace spanformer::nn {

torch::Tensor gumbel_noise(at::IntArrayRef sizes, const at::TensorOptions& options);
torch::Tensor gumbel_softmax(const torch::Tensor& logits, double tau, bool hard);
// The same with given noise g (so that one draw can serve several forward passes).
torch::Tensor gumbel_softmax(const torch::Tensor& logits, const torch::Tensor& noise, double tau, bool hard);
// One-hot of the argmax along the last dimension (first maximum on ties).
torch::Tensor one_hot_argmax(const torch::Tensor& x);

}  // namespace spanformer::nn
