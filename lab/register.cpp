// What the lab adds to the library's tables (lab.h says when and why).
#include "lab.h"

#include <ATen/ATen.h>
#ifndef SPANFORMER_CUDA_EMULATE
#include <ATen/autocast_mode.h>
#endif

#include "cuda/kernels.h"
#include "spanformer/ops/step_ops.h"
#include "step_autograd.h"

namespace spanformer::lab {
namespace {

bool kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// The fused kernels take CUDA activations of float32 / bfloat16 / float16 (one dtype after the add's
// promotion) with parameters float32 or that dtype, and no autocast-narrowed norm (under autocast
// layer_norm runs in float32 whatever its input: the kernels then only for float32 sums).
std::optional<ops::SumAndNorm> add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight,
                                              const at::Tensor& bias, double eps) {
  const auto common = at::result_type(x, r);
#ifdef SPANFORMER_CUDA_EMULATE
  const bool narrowed = false;
#else
  const bool narrowed = at::autocast::is_autocast_enabled(at::kCUDA) && common != at::kFloat;
#endif
  if (narrowed || !kernel_dtype(common) || !(weight.scalar_type() == at::kFloat || weight.scalar_type() == common) ||
      x.sizes() != r.sizes())
    return std::nullopt;
  auto out = ops::AddLayerNormFunction::apply(x.to(common), r.to(common), weight, bias.to(weight.scalar_type()), eps);
  return ops::SumAndNorm{out[0], out[1]};  // (..., H) twice
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh) {
  if (!(bias.scalar_type() == at::kFloat || bias.scalar_type() == x.scalar_type())) return {};
  return ops::BiasGeluFunction::apply(x, bias, tanh);  // (..., H)
}

}  // namespace

void set_kernel_rows(bool present) {
  if (!present) ops::cuda::lab_kernels() = ops::cuda::LabKernels{};
  else register_rows();
}

void register_rows() {
  auto& k = ops::cuda::lab_kernels();
  k.linked = true;
  k.flash_forward_applies = &ops::cuda::flash_lab_forward_applies;
  k.flash_forward = &ops::cuda::flash_lab_forward;
  k.flash_backward_applies = &ops::cuda::flash_lab_backward_applies;
  k.flash_backward = &ops::cuda::flash_lab_backward;
  k.span_forward_applies = &ops::cuda::span_lab_forward_applies;
  k.span_forward = &ops::cuda::span_lab_forward;
  ops::add_step_row({"kernels", [](const at::Tensor& x) { return x.is_cuda() && kernel_dtype(x.scalar_type()); },
                     &add_layer_norm, &bias_gelu});
}

}  // namespace spanformer::lab
