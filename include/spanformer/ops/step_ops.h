// A training step's elementwise work between its products, as one op each, so that a device with fused
// kernels runs each pass in one launch (the lab's lab/cuda/step_kernels.cu) where ATen takes two or more:
//
//   add_layer_norm(x, r, w, b, eps) = {s, y},   s = x + r,   y = layer_norm(s) over the last axis (H = w.numel(),
//                                               biased variance, eps inside the square root) times w plus b
//   bias_gelu(x, b, tanh)           = gelu(x + b) in x's dtype, exact (erf) or its tanh approximation
//
// Two rows, one table: the ATen composition (`x + r` then `at::layer_norm`; `at::gelu(x + b)` with b in
// x's dtype), the reference, which every device and dtype runs by default; and a row of fused kernels
// that a program adds with add_step_row (the lab's CUDA kernels, lab/register.cpp, in a build with
// -DSPANFORMER_LAB=ON), which runs when SPANFORMER_STEP_KERNELS=kernels and it takes the tensors. A
// kernel row's gradients: ds = dx = dr, dw, db; d(x + b) and db.
#pragma once
#include <ATen/ATen.h>

#include <optional>

namespace spanformer::ops {

struct SumAndNorm {
  at::Tensor sum;  // (..., H): x + r
  at::Tensor out;  // (..., H): its layer norm
};

SumAndNorm add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
                          double eps);
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh);

// A row of fused kernels. `takes` says whether it runs tensors like x at all; each op may still give the
// composition back for its other arguments by returning nothing (an undefined tensor).
struct StepRow {
  const char* name;
  bool (*takes)(const at::Tensor& x);
  std::optional<SumAndNorm> (*add_layer_norm)(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight,
                                              const at::Tensor& bias, double eps);
  at::Tensor (*bias_gelu)(const at::Tensor& x, const at::Tensor& bias, bool tanh);
};
void add_step_row(const StepRow& row);  // before the first step; one kernel row at most

// Which way these ops run: SPANFORMER_STEP_KERNELS = auto (the composition) | kernels (the added row where
// it takes the tensors; a program without one says so in one line) | composition. A bad value is one
// line naming the three.
bool step_kernels_take(const at::Tensor& x);

}  // namespace spanformer::ops
