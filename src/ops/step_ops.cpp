// The step ops' one entry each: the ATen composition (the reference, and the default everywhere), or
// the CUDA kernels' autograd functions (src/ops/step_autograd.h) when SPANFORMER_STEP_KERNELS=kernels
// and they take the tensors. Semantics: include/spanformer/ops/step_ops.h.
#include "spanformer/ops/step_ops.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "spanformer/util/error.h"
#include "spanformer/util/switches.h"

#ifdef SPANFORMER_WITH_CUDA
#include <ATen/autocast_mode.h>

#include "step_autograd.h"
#endif

namespace spanformer::ops {
namespace {

enum class StepKernels { automatic, kernels, composition };

StepKernels step_kernels_mode() {
  const std::string value = switch_value("SPANFORMER_STEP_KERNELS");  // util/switches.h
  return value == "kernels" ? StepKernels::kernels : value == "composition" ? StepKernels::composition
                                                                             : StepKernels::automatic;
}

bool kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

}  // namespace

bool step_kernels_take(const at::Tensor& x) {
#ifdef SPANFORMER_WITH_CUDA
  return step_kernels_mode() == StepKernels::kernels && x.is_cuda() && kernel_dtype(x.scalar_type());
#else
  (void)step_kernels_mode();  // a bad value is refused in every build
  (void)x;
  return false;
#endif
}

SumAndNorm add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
                          double eps) {
#ifdef SPANFORMER_WITH_CUDA
  const auto common = at::result_type(x, r);
  // Under autocast layer_norm runs in float32 whatever its input: the kernels then only for float32 sums.
  const bool narrowed = at::autocast::is_autocast_enabled(at::kCUDA) && common != at::kFloat;
  if (!narrowed && step_kernels_take(x) && kernel_dtype(common) &&
      (weight.scalar_type() == at::kFloat || weight.scalar_type() == common) && x.sizes() == r.sizes()) {
    auto out = AddLayerNormFunction::apply(x.to(common), r.to(common), weight, bias.to(weight.scalar_type()), eps);
    return {out[0], out[1]};
  }
#endif
  auto s = x + r;                                                                  // (..., H)
  return {s, at::layer_norm(s, {weight.numel()}, weight, bias, eps)};              // (..., H)
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh) {
#ifdef SPANFORMER_WITH_CUDA
  if (step_kernels_take(x) && (bias.scalar_type() == at::kFloat || bias.scalar_type() == x.scalar_type()))
    return BiasGeluFunction::apply(x, bias, tanh);
#endif
  return at::gelu(x + bias.to(x.scalar_type()), tanh ? "tanh" : "none");  // (..., H), in x's dtype
}

}  // namespace spanformer::ops
