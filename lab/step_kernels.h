// The fused step kernels' LibTorch glue (step_kernels_cuda.cpp; the kernels: cuda/step_kernels.cu): the
// lab's row of the step ops (include/spanformer/ops/step_ops.h), added by register.cpp.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace spanformer::ops::cuda_glue {

// Their LibTorch glue (step_kernels_cuda.cpp): activations float32 / bfloat16 / float16 of one dtype, rows
// of H = weight.numel() contiguous elements; parameters float32 or the activations' dtype.
struct AddLayerNormForward {
  at::Tensor sum, out, mean, rstd;  // (..., H) twice, then (rows) float32 twice
};
AddLayerNormForward add_layer_norm_forward(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight,
                                           const at::Tensor& bias, double eps);
// (ds, dweight, dbias); grad_sum may be undefined (nothing reaches s but through the norm).
std::vector<at::Tensor> add_layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& grad_sum,
                                                const AddLayerNormForward& saved, const at::Tensor& weight);
at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, bool tanh);
std::vector<at::Tensor> bias_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& bias,
                                           bool tanh);  // (dx, dbias)

}  // namespace spanformer::ops::cuda_glue
