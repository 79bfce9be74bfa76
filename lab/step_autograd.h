// The autograd functions of the fused step kernels (include/spanformer/ops/step_ops.h) over their glue
// (step_kernels_cuda.cpp): the lab's step row (register.cpp) runs them on CUDA tensors, and the tests on
// CPU tensors through the CPU model of CUDA, which compiles the same glue.
#pragma once
#include <torch/autograd.h>

#include "step_kernels.h"

namespace spanformer::ops {

struct AddLayerNormFunction : torch::autograd::Function<AddLayerNormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
                                                double eps) {
    auto f = cuda_glue::add_layer_norm_forward(x, r, weight, bias, eps);
    ctx->save_for_backward({f.sum, f.mean, f.rstd, weight});
    return {f.sum, f.out};  // (..., H) twice
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const cuda_glue::AddLayerNormForward f{saved[0], at::Tensor(), saved[1], saved[2]};
    const auto dy = grads[1].defined() ? grads[1] : at::zeros_like(saved[0]);  // the norm unused
    auto g = cuda_glue::add_layer_norm_backward(dy, grads[0], f, saved[3]);
    return {g[0], g[0], g[1], g[2], at::Tensor()};
  }
};

struct BiasGeluFunction : torch::autograd::Function<BiasGeluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                            bool tanh) {
    ctx->save_for_backward({x, bias});
    ctx->saved_data["tanh"] = tanh;
    return cuda_glue::bias_gelu_forward(x, bias, tanh);  // (..., H)
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto g = cuda_glue::bias_gelu_backward(grads[0], saved[0], saved[1], ctx->saved_data["tanh"].toBool());
    return {g[0], g[1], at::Tensor()};
  }
};

}  // namespace spanformer::ops
