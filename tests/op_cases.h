// The hand-written kernels' cases and their measure, shared by the tests that run them on a GPU
// (test_cuda.cpp, label cuda) and on the CPU model of CUDA (test_cuda_emulated.cpp, every CI run).
//
// Tolerances are relative to the error of the same-precision reference computed on the same device:
// the double-precision reference composition on the CPU is the truth, and a kernel's result may be at
// most a small multiple of the plain float32 (or bfloat16) composition's own distance from it. A kernel
// that drops a term, reads the wrong key or leaves an output unwritten misses by orders of magnitude.
#pragma once
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"
#include "util.h"

namespace spanformer::tu {

// Output and gradients of one implementation (kernel: the path under test; else the plain composition)
// in one dtype on one device.
using KernelRun = std::function<std::vector<at::Tensor>(bool kernel, at::ScalarType dtype, at::Device device)>;

// Each output of the kernel path on `device` within `factor` times the same-dtype composition's own
// distance (on the same device) from the double-precision CPU reference, relative to the largest
// magnitude of the reference; no NaN (the inputs' allocator is poisoned, so an unwritten element shows).
inline void expect_within_reference_error(const KernelRun& run, const std::vector<std::string>& names,
                                          const std::string& label, at::ScalarType dtype, double factor,
                                          at::Device device) {
  const auto truth = run(false, at::kDouble, at::kCPU);
  const auto ref = run(false, dtype, device);
  const auto kernel = run(true, dtype, device);
  for (size_t i = 0; i < truth.size(); ++i) {
    ASSERT_FALSE(kernel[i].isnan().any().item<bool>()) << names[i] << ": NaN (an unwritten element?)";
    const double scale = std::max(1e-3, truth[i].abs().max().item<double>());
    const double ref_error = max_diff(ref[i], truth[i]) / scale, kernel_error = max_diff(kernel[i], truth[i]) / scale;
    // The floor, where the same-dtype composition happens to be (nearly) exact: a few units in the last
    // place of the dtype relative to the largest magnitude (fp32 1e-6 = 8 ulp of 2^-23; fp16 1e-3 = 1 ulp
    // of 2^-10; bf16 1e-2 = 1.3 ulp of 2^-7). The allowed error is factor x max(composition's, floor).
    const double floor = dtype == at::kFloat ? 1e-6 : dtype == at::kHalf ? 1e-3 : 1e-2;
    const char* dtype_name = dtype == at::kFloat ? "fp32" : dtype == at::kHalf ? "fp16" : "bf16";
    std::printf("measured: %s %-10s %s: kernel %.3g, plain composition %.3g\n", dtype_name, names[i].c_str(),
                label.c_str(), kernel_error, ref_error);
    EXPECT_LE(kernel_error, factor * std::max(ref_error, floor))
        << names[i] << ": kernel " << kernel_error << ", plain composition " << ref_error << " (relative to max "
        << scale << ")";
  }
}

// Inputs (already on the device, in the dtype, requiring grad) -> output; differentiable.
using Inputs = std::vector<at::Tensor>;

// Each input on (device, dtype), requiring grad. An output element a kernel never writes shows as NaN:
// on the CPU model of CUDA the glue's outputs start as NaN (cuda::uninitialized, src/ops/cuda/glue.h);
// on the GPU a NaN block is allocated and freed here, so that LibTorch's caching allocator hands its
// memory to the next tensors of the device (the kernel's outputs).
inline Inputs inputs_on(const Inputs& inputs, at::ScalarType dtype, at::Device device) {
  Inputs in;
  for (const auto& t : inputs) in.push_back(t.to(device, dtype).requires_grad_(true));
  if (device.is_cuda()) {
    const auto poison = at::full({in[0].numel() * 4}, NAN, in[0].options().requires_grad(false));  // freed at once
  }
  return in;
}

// [out, d sum(out * weights) / d input for each input].
inline std::vector<at::Tensor> output_and_gradients(const at::Tensor& out, const Inputs& in, const at::Tensor& weights) {
  auto grads = torch::autograd::grad({(out.to(at::kDouble) * weights.to(out.device())).sum()}, in);
  std::vector<at::Tensor> result = {out.detach()};
  for (auto& g : grads) result.push_back(g);
  return result;
}

// ---- adaptive_span_attention ------------------------------------------------------------------------

struct SpanCase {
  int64_t B, K, M, W, D, L;
  std::vector<double> spans;  // z per head, tokens
  double dropout;
};

// Spans away from the mask's kinks (z - (d - 1) = 0 or -R for an integer distance d): there a ratio
// rounded to float32 or bfloat16 moves one distance in or out of the ramp, and the span gradient with it.
inline const std::vector<SpanCase>& span_cases() {
  static const std::vector<SpanCase> cases = {
      {2, 2, 70, 40, 64, 100, {3.5, 90.0}, 0.0},          // M not a multiple of anything; spans short and long
      {1, 3, 130, 64, 32, 64, {0.0, 20.25, 64.0}, 0.0},  // span 0, the whole window, D 32
      {2, 2, 33, 30, 128, 30, {12.4, 2.3}, 0.0},          // D 128, window = L
      {1, 2, 40, 48, 256, 48, {46.6, 5.3}, 0.0},          // D 256, the largest the kernel takes
      {1, 2, 66, 20, 32, 40, {10.4, 30.0}, 0.3},          // dropout (same hash stream on every device)
      {1, 2, 100, 300, 64, 300, {6.5, 250.3}, 0.0},       // whole key tiles beyond a head's span (Z only)
  };
  return cases;
}

inline std::string span_label(const SpanCase& c) {
  return fmt::format("B{} K{} M{} W{} D{} dropout {}", c.B, c.K, c.M, c.W, c.D, c.dropout);
}

inline ops::SpanAttentionOptions span_options(const SpanCase& c) {
  ops::SpanAttentionOptions o;
  o.attn_span = c.L;
  o.ramp = 8;
  o.dropout = c.dropout;
  o.training = c.dropout > 0;
  o.seed = 4321;
  return o;
}

// The op's kernel path: (q, k, v, key_pe, span_ratio) -> out.
using SpanKernel = std::function<at::Tensor(const Inputs& in, const ops::SpanAttentionOptions& o)>;

inline void expect_span_within_reference_error(const SpanCase& c, at::ScalarType dtype, double factor,
                                               at::Device device, const SpanKernel& kernel) {
  at::manual_seed(11 + static_cast<uint64_t>(c.M));
  auto o64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<double> ratios;
  for (double z : c.spans) ratios.push_back(z / static_cast<double>(c.L));
  const Inputs inputs = {at::randn({c.B, c.K, c.M, c.D}, o64), at::randn({c.B, c.K, c.W + c.M, c.D}, o64),
                         at::randn({c.B, c.K, c.W + c.M, c.D}, o64), at::randn({c.D, c.L}, o64),
                         at::tensor(ratios, o64)};
  const auto o = span_options(c);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, o64);
  expect_within_reference_error(
      [&](bool use_kernel, at::ScalarType t, at::Device d) {
        const auto in = inputs_on(inputs, t, d);
        auto out = use_kernel ? kernel(in, o) : ops::adaptive_span_attention_reference(in[0], in[1], in[2], in[3], in[4], o);
        return output_and_gradients(out, in, weights);
      },
      {"out", "q", "k", "v", "key_pe", "span_ratio"}, span_label(c), dtype, factor, device);
}

// ---- flash_attention --------------------------------------------------------------------------------

// q (B, K, N, D), k and v (B, K, C, D), the keys' band (0 = dense) and dropout.
struct FlashCase {
  int64_t B, K, N, C, D, band;
  double dropout;
};

inline const std::vector<FlashCase>& flash_cases() {
  static const std::vector<FlashCase> cases = {
      {2, 3, 70, 70, 64, 0, 0.0},      // N not a multiple of the 8-row blocks or the 32-key tiles
      {1, 2, 37, 100, 32, 0, 0.0},     // a KV cache: 63 earlier keys
      {2, 2, 130, 130, 128, 17, 0.0},  // a sliding window of 17 keys
      {1, 2, 40, 40, 256, 0, 0.0},     // D 256, the largest the kernels take
      {1, 2, 66, 66, 48, 0, 0.3},      // dropout (the same hash stream as the CPU); D not a multiple of 32
      {1, 1, 1, 50, 64, 0, 0.0},       // one query over a cache (generation)
  };
  return cases;
}

// The op's kernel path: (q, k, v) -> out, options with the band resolved (1 .. C) and the seed set.
using FlashKernel = std::function<at::Tensor(const Inputs& in, const ops::FlashOptions& o)>;

inline void expect_flash_within_reference_error(const FlashCase& c, at::ScalarType dtype, double factor,
                                                at::Device device, const FlashKernel& kernel) {
  at::manual_seed(17 + static_cast<uint64_t>(c.N));
  auto o64 = at::TensorOptions().dtype(at::kDouble);
  const Inputs inputs = {at::randn({c.B, c.K, c.N, c.D}, o64), at::randn({c.B, c.K, c.C, c.D}, o64),
                         at::randn({c.B, c.K, c.C, c.D}, o64)};
  const auto weights = at::randn({c.B, c.K, c.N, c.D}, o64);
  ops::FlashOptions o;
  o.band = c.band == 0 ? c.C : c.band;
  o.dropout = c.dropout;
  o.training = c.dropout > 0;
  o.seed = 4321;
  o.cuda_kernel = true;
  const auto label = fmt::format("B{} K{} N{} C{} D{} band {} dropout {}", c.B, c.K, c.N, c.C, c.D, c.band, c.dropout);
  expect_within_reference_error(
      [&](bool use_kernel, at::ScalarType t, at::Device d) {
        const auto in = inputs_on(inputs, t, d);
        auto out = use_kernel ? kernel(in, o) : ops::flash_attention_reference(in[0], in[1], in[2], o);
        return output_and_gradients(out, in, weights);
      },
      {"out", "q", "k", "v"}, label, dtype, factor, device);
}

}  // namespace spanformer::tu
