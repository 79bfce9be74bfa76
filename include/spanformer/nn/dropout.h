// Dropout whose mask is a hash of (seed, element index): what every model here drops with.
//
// ATen's CPU dropout fills a tensor with one Bernoulli draw per element from the generator (a Mersenne
// Twister step each, one element at a time), divides it by 1 - p, multiplies, and keeps that mask for
// the backward pass. On a 2-core CPU those draws were a sixth of the seq2seq Transformer's training step.
// Here each call draws one 64-bit seed from the default generator (so `torch::manual_seed` and a
// checkpoint's saved generator state fix it, as they fix ATen's draws), and element i of the contiguous
// tensor is kept when a counter-based hash of (seed, i) is at least p 2^32:
//
//     y[i] = x[i] * keep(seed, i) / (1 - p)            dy/dx[i] = keep(seed, i) / (1 - p)
//
// The backward pass recomputes the mask from the seed, so nothing is stored and each direction is one
// vectorised pass over the tensor. The hash is two rounds of a 32-bit integer finaliser (see
// `dropout_keeps`): every lane of an AVX-512 or AVX2 register hashes its own index, and the mask does not
// depend on how many threads share the tensor. The kept fraction is 1 - p to within 2^-32.
//
// CPU tensors take this path; on other devices `dropout` calls ATen's (CUDA has its own fused kernel).
// `dropout_reference` is the same mask built one element at a time in double precision: the tests hold
// the fast path to it.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/modules/dropout.h>

#include <cstdint>

namespace spanformer::nn {

// Whether element `index` survives under `seed` at drop probability p (the hash, scalar).
bool dropout_keeps(uint64_t seed, int64_t index, double p);

// Training: x with each element dropped (p) or scaled by 1 / (1 - p), differentiable, one fresh seed from
// the default generator per call. Not training, or p = 0: x itself. (...) -> (...)
at::Tensor dropout(const at::Tensor& x, double p, bool training);

// The mask of one given seed (CPU), differentiable (its backward is the same mask on the gradient). (...) -> (...)
at::Tensor dropout_with_seed(const at::Tensor& x, double p, uint64_t seed);

// Plain loop over `dropout_keeps`, in double precision, cast to x's dtype: what the tests compare with. (...) -> (...)
at::Tensor dropout_reference(const at::Tensor& x, double p, uint64_t seed);

// torch::nn::Dropout with the forward above; same options, no parameters or buffers (checkpoints unchanged).
class DropoutImpl : public torch::nn::DropoutImpl {
 public:
  using torch::nn::DropoutImpl::DropoutImpl;
  at::Tensor forward(const at::Tensor& input) { return nn::dropout(input, options.p(), is_training()); }  // (...) -> (...)
};
TORCH_MODULE(Dropout);

}  // namespace spanformer::nn
