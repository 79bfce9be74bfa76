// torch::nn::Linear with ATen's linear as its forward: the layer every model here uses.
//
// The C++ frontend's Linear computes a batched input (B, N, in) as matmul(x, W^T) and then adds the
// bias in a second pass over the (B, N, out) result; under autocast that pass adds the float32 bias to
// the bf16 product with a type promotion, and its backward sums the bias gradient in another. ATen's
// linear (what PyTorch's nn.Linear calls) folds the bias into the product (addmm over the flattened
// rows) and, under autocast, casts input, weight and bias once. The parameters, their names ("weight",
// "bias") and the options are the frontend's, so checkpoints and `as<torch::nn::Linear>()` are unchanged.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

namespace spanformer::nn {

class LinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& input) { return at::linear(input, weight, bias); }  // (..., in) -> (..., out)
};
TORCH_MODULE(Linear);

}  // namespace spanformer::nn
