// A training step's elementwise work between its products, as one op each, so that a device with fused
// kernels runs each pass in one launch (src/ops/cuda/step_kernels.cu) where ATen takes two or more:
//
//   add_layer_norm(x, r, w, b, eps) = {s, y},   s = x + r,   y = layer_norm(s) over the last axis (H = w.numel(),
//                                               biased variance, eps inside the square root) times w plus b
//   bias_gelu(x, b, tanh)           = gelu(x + b) in x's dtype, exact (erf) or its tanh approximation
//
// The reference is the ATen composition (`x + r` then `at::layer_norm`; `at::gelu(x + b)` with b in x's dtype), which every
// device and dtype runs by default: the CUDA kernels (float32 / bfloat16 / float16 activations of one
// dtype after the add's promotion, parameters float32 or that dtype, no autocast-narrowed norm) run when
// SPANFORMER_STEP_KERNELS=kernels (awaiting a GPU: docs/platform.md; scripts/gpu-check.sh train). Their
// gradients: ds = dx = dr, dw, db; d(x + b) and db. Held to the double-precision composition on the
// CPU model of CUDA (StepKernelsEmulated.*) and on a GPU (StepKernelsCuda.*).
#pragma once
#include <ATen/ATen.h>

namespace spanformer::ops {

struct SumAndNorm {
  at::Tensor sum;  // (..., H): x + r
  at::Tensor out;  // (..., H): its layer norm
};

SumAndNorm add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
                          double eps);
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh);

// Which way these ops run: SPANFORMER_STEP_KERNELS = auto (the composition, until the kernels are
// measured faster on a GPU) | kernels (the CUDA kernels where they take the tensors) | composition.
// A bad value is one line naming the three.
bool step_kernels_take(const at::Tensor& x);

}  // namespace spanformer::ops
