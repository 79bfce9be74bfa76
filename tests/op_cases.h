// One case list per op, run on every backend a build has (ggml's test-backend-ops is the example):
//   backend              where                                   cases run as
//   cpu (the CPU row)    test_span_attention_op.cpp, test_flash  double: equal to the reference; float32: within its error
//   the CPU model of CUDA test_cuda_emulated.cpp (every CI run)  float32 / bfloat16 / float16 within their error
//   cuda                 test_cuda.cpp (label cuda)              the same, on the GPU
// and in two modes: test (the cases marked test, above) and perf (the cases marked perf, timed by
// `spanformer_tests --op-perf` on the CPU or a GPU: tests/op_perf.cpp).
//
// Tolerances are relative to the error of the same-precision reference computed on the same device:
// the double-precision reference composition on the CPU is the truth, and a kernel's result may be at
// most a small multiple of the plain float32 (or bfloat16) composition's own distance from it. A kernel
// that drops a term, reads the wrong key or leaves an output unwritten misses by orders of magnitude.
#pragma once
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ops/cuda/variants.h"
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
  // A result that is exactly 0 in truth (the q and k gradients of a band of one key: each softmax row is
  // the constant 1) is measured against the largest magnitude of the case: its kernel value is the
  // rounding residue of terms of that size (dP - rowsum(dO o O) in a flash backward).
  double case_scale = 0;
  for (const auto& t : truth) case_scale = std::max(case_scale, t.abs().max().item<double>());
  for (size_t i = 0; i < truth.size(); ++i) {
    ASSERT_FALSE(kernel[i].isnan().any().item<bool>()) << names[i] << ": NaN (an unwritten element?)";
    const double largest = truth[i].abs().max().item<double>();
    const double scale = std::max(1e-3, largest == 0 ? case_scale : largest);
    const double ref_error = max_diff(ref[i], truth[i]) / scale, kernel_error = max_diff(kernel[i], truth[i]) / scale;
    // The floor, where the same-dtype composition happens to be (nearly) exact: a few units in the last
    // place of the dtype relative to the largest magnitude (fp32 1e-6 = 8 ulp of 2^-23; fp16 1e-3 = 1 ulp
    // of 2^-10; bf16 1e-2 = 1.3 ulp of 2^-7). The allowed error is factor x max(composition's, floor).
    // The span ratios' gradient in 16 bits has 4 times that floor: it is a per-head sum over every row's
    // ramp of dw = (dO . v - dO . out) / N, which cancels, and the kernels take dO . out from the stored
    // 16-bit output (as FlashAttention's delta): version 0 measured 0.029 in bf16 at D 256 (3.8 ulp),
    // where the composition's own error is 0.047 with LibTorch 2.x and 0.0027 with Debian's 1.13 on an
    // AVX2-only EPYC (2026-11-26; the 1.13 stage failed there, not on the AVX-512 machines before).
    const double ulps = dtype != at::kFloat && names[i] == "span_ratio" ? 4.0 : 1.0;
    const double floor = ulps * (dtype == at::kFloat ? 1e-6 : dtype == at::kHalf ? 1e-3 : 1e-2);
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
  bool test = true, perf = false;
};

// Spans away from the mask's kinks (z - (d - 1) = 0 or -R for an integer distance d): there a ratio
// rounded to float32 or bfloat16 moves one distance in or out of the ramp, and the span gradient with it.
inline const std::vector<SpanCase>& span_cases() {
  static const std::vector<SpanCase> cases = [] {
    std::vector<SpanCase> c = {
        {2, 2, 5, 16, 32, 16, {0.0, 16.0}, 0.0},            // M smaller than any tile; spans 0 and L
        {2, 2, 70, 40, 64, 100, {3.5, 90.0}, 0.0},          // M not a multiple of anything; spans short and long
        {1, 3, 130, 64, 32, 64, {0.0, 20.25, 64.0}, 0.0},  // span 0, the whole window, D 32
        {1, 2, 130, 24, 96, 64, {50.5, 7.3}, 0.0},          // a window shorter than the span; D 96
        {2, 2, 33, 30, 128, 30, {12.4, 2.3}, 0.0},          // D 128, window = L
        {1, 2, 40, 48, 256, 48, {46.6, 5.3}, 0.0},          // D 256, the largest the kernel takes
        {1, 2, 66, 20, 32, 40, {10.4, 30.0}, 0.3},          // dropout (same hash stream on every device)
        {1, 2, 100, 300, 64, 300, {6.5, 250.3}, 0.0},       // whole key tiles beyond a head's span (Z only)
        {1, 2, 100, 200, 64, 200, {180.5, 150.5}, 0.0},     // heads visiting most of the window: whole
                                                             // tiles inside it and the span (no mask)
    };
    // Perf: the peers' shape (docs/benchmarks.md), K 8 heads of D 64 over a window of 8192 keys, every
    // head at L and bimodal (half short, half long: the spans adaptive span learns).
    c.push_back({1, 8, 512, 8192, 64, 8192, std::vector<double>(8, 8192.0), 0.0, false, true});
    c.push_back({1, 8, 512, 8192, 64, 8192, {40.5, 80.5, 160.5, 320.5, 4000.5, 6000.5, 7000.5, 8100.5}, 0.0, false, true});
    c.push_back({2, 4, 256, 1024, 64, 1024, {20.5, 100.5, 500.5, 1000.5}, 0.0, false, true});  // bench_small's layer
    return c;
  }();
  return cases;
}

// The cases of one mode (test or perf) of a list.
template <typename Case>
std::vector<Case> cases_of(const std::vector<Case>& all, bool perf) {
  std::vector<Case> out;
  for (const auto& c : all)
    if (perf ? c.perf : c.test) out.push_back(c);
  return out;
}
inline std::vector<SpanCase> span_test_cases() { return cases_of(span_cases(), false); }

inline std::string span_label(const SpanCase& c) {
  const auto [lo, hi] = std::minmax_element(c.spans.begin(), c.spans.end());
  return fmt::format("B{} K{} M{} W{} D{} L{} spans {}..{} dropout {}", c.B, c.K, c.M, c.W, c.D, c.L, *lo, *hi, c.dropout);
}

// The case's floating-point operations, closed form, as the reference composition computes them: the
// scores q.k and q.key_pe and the value product over the whole window, 2 M W D each per (batch, head),
// and in the backward twice that (dP = dO v^T, dv = A^T dO, dq from both score products, dk, dkey_pe).
// Nominal: a kernel that skips the distances beyond a head's span shows it as a higher rate.
struct Flops {
  double forward, backward;
};
inline Flops span_flops(const SpanCase& c) {
  const double f = 6.0 * c.B * c.K * c.M * c.W * c.D;
  return {f, 2 * f};
}

// The case's inputs in double on the CPU (q, k, v, key_pe, span_ratio), from a seed of its own.
inline std::vector<at::Tensor> span_inputs(const SpanCase& c) {
  at::manual_seed(11 + static_cast<uint64_t>(c.M));
  auto o64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<double> ratios;
  for (double z : c.spans) ratios.push_back(z / static_cast<double>(c.L));
  return {at::randn({c.B, c.K, c.M, c.D}, o64), at::randn({c.B, c.K, c.W + c.M, c.D}, o64),
          at::randn({c.B, c.K, c.W + c.M, c.D}, o64), at::randn({c.D, c.L}, o64), at::tensor(ratios, o64)};
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
  const Inputs inputs = span_inputs(c);
  const auto o = span_options(c);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, at::kDouble);
  expect_within_reference_error(
      [&](bool use_kernel, at::ScalarType t, at::Device d) {
        const auto in = inputs_on(inputs, t, d);
        auto out = use_kernel ? kernel(in, o) : ops::adaptive_span_attention_reference(in[0], in[1], in[2], in[3], in[4], o);
        return output_and_gradients(out, in, weights);
      },
      {"out", "q", "k", "v", "key_pe", "span_ratio"}, span_label(c), dtype, factor, device);
}

// ---- flash_attention --------------------------------------------------------------------------------

// q (B, K, N, D), k and v (B, K, C, D), the keys' band (0 = dense), dropout, and the ATen tiles' size
// (the cpu row; the CUDA kernels have their own).
struct FlashCase {
  int64_t B, K, N, C, D, band;
  double dropout;
  int64_t tile = 256;
  bool test = true, perf = false;
};

inline const std::vector<FlashCase>& flash_cases() {
  static const std::vector<FlashCase> cases = {
      {2, 3, 70, 70, 64, 0, 0.0, 32},      // N not a multiple of the 8-row blocks or the 32-key tiles
      {1, 2, 37, 100, 32, 0, 0.0, 16},     // a KV cache: 63 earlier keys
      {2, 2, 130, 130, 128, 17, 0.0, 64},  // a sliding window of 17 keys
      {1, 2, 40, 40, 256, 0, 0.0},         // D 256, the largest the kernels take
      {1, 2, 66, 66, 48, 0, 0.3, 8},       // dropout (the same hash stream as the CPU); D not a multiple of 32
      {1, 1, 1, 50, 64, 0, 0.0, 7},        // one query over a cache (generation)
      {2, 3, 1, 300, 48, 0, 0.0, 64},      // one query a head over several key tiles, D not a multiple of 16
      {2, 2, 1, 90, 24, 33, 0.2, 16},      // one query with a band and dropout
      {1, 2, 66, 66, 64, 0, 0.3, 32},      // dropout at D 64 (the CUDA kernels' version 1 both ways)
      {2, 2, 100, 140, 32, 21, 0.0, 32},   // a band of 21 over 40 cached keys at D 32 (version 1 both ways)
      // The tiles' edges, D 8: one token, tiles of 7 and 8 over 37, more keys than queries, bands of 1,
      // 5, 12 and beyond the keys, dropout with a band.
      {2, 3, 1, 1, 8, 0, 0.0, 128},   {2, 3, 5, 5, 8, 0, 0.0, 128},   {2, 3, 37, 37, 8, 0, 0.0, 8},
      {2, 3, 37, 37, 8, 0, 0.0, 7},   {2, 3, 64, 64, 8, 0, 0.0, 16},  {2, 3, 13, 50, 8, 0, 0.0, 8},
      {2, 3, 37, 37, 8, 1, 0.0, 8},   {2, 3, 37, 37, 8, 5, 0.0, 8},   {2, 3, 30, 61, 8, 12, 0.0, 7},
      {2, 3, 37, 37, 8, 100, 0.0, 8}, {2, 3, 37, 37, 8, 0, 0.3, 8},   {2, 3, 20, 45, 8, 9, 0.5, 6},
      {2, 3, 150, 150, 8, 0, 0.1, 128},
      // Perf: causal self-attention of K 8 heads of D 64 at 1k and 4k tokens, and a window of 128.
      {1, 8, 1024, 1024, 64, 0, 0.0, 256, false, true},
      {1, 8, 4096, 4096, 64, 0, 0.0, 256, false, true},
      {1, 8, 4096, 4096, 64, 128, 0.0, 256, false, true},
  };
  return cases;
}

inline std::vector<FlashCase> flash_test_cases() { return cases_of(flash_cases(), false); }

inline std::string flash_label(const FlashCase& c) {
  return fmt::format("B{} K{} N{} C{} D{} band {} dropout {} tile {}", c.B, c.K, c.N, c.C, c.D, c.band, c.dropout, c.tile);
}

inline ops::FlashOptions flash_options(const FlashCase& c) {
  ops::FlashOptions o;
  o.band = c.band == 0 ? c.C : c.band;
  o.dropout = c.dropout;
  o.training = c.dropout > 0;
  o.seed = 4321;
  o.tile = c.tile;
  o.cuda_kernel = true;
  return o;
}

// The case's floating-point operations, closed form: P (query, key) pairs inside the causal band
// (queries whose position offset + i + 1 is under the band see every earlier key, the rest see `band`),
// 4 P D per (batch, head) forward (QK^T, PV) and 10 P D backward (QK^T again, dO V^T, P^T dO, dS K,
// dS^T Q), as FlashAttention counts them.
inline Flops flash_flops(const FlashCase& c) {
  const double band = static_cast<double>(c.band == 0 || c.band > c.C ? c.C : c.band), offset = double(c.C - c.N);
  const double short_rows = std::clamp(band - offset - 1, 0.0, static_cast<double>(c.N));  // rows with fewer keys
  const double pairs = short_rows * offset + short_rows * (short_rows + 1) / 2 + (c.N - short_rows) * band;
  const double per_pair = static_cast<double>(c.B) * c.K * c.D;
  return {4 * pairs * per_pair, 10 * pairs * per_pair};
}

// The case's inputs in double on the CPU (q, k, v), from a seed of its own.
inline std::vector<at::Tensor> flash_inputs(const FlashCase& c) {
  at::manual_seed(17 + static_cast<uint64_t>(c.N) * 100 + static_cast<uint64_t>(c.C));
  auto o64 = at::TensorOptions().dtype(at::kDouble);
  return {at::randn({c.B, c.K, c.N, c.D}, o64), at::randn({c.B, c.K, c.C, c.D}, o64), at::randn({c.B, c.K, c.C, c.D}, o64)};
}

// The op's kernel path: (q, k, v) -> out, options with the band resolved (1 .. C) and the seed set.
using FlashKernel = std::function<at::Tensor(const Inputs& in, const ops::FlashOptions& o)>;

inline void expect_flash_within_reference_error(const FlashCase& c, at::ScalarType dtype, double factor,
                                                at::Device device, const FlashKernel& kernel) {
  const Inputs inputs = flash_inputs(c);
  const auto weights = at::randn({c.B, c.K, c.N, c.D}, at::kDouble);
  const auto o = flash_options(c);
  expect_within_reference_error(
      [&](bool use_kernel, at::ScalarType t, at::Device d) {
        const auto in = inputs_on(inputs, t, d);
        auto out = use_kernel ? kernel(in, o) : ops::flash_attention_reference(in[0], in[1], in[2], o);
        return output_and_gradients(out, in, weights);
      },
      {"out", "q", "k", "v"}, flash_label(c), dtype, factor, device);
}

// ---- rows ---------------------------------------------------------------------------------------------

// The rows of an op's table (`names`, in its order) that take inputs like q: those an Override (the
// op's SpanBackendOverride or FlashBackendOverride) can force for q without the op refusing.
template <class Override, class BackendOf>
std::vector<std::string> rows_taking(const std::vector<std::string>& names, const at::Tensor& q, BackendOf backend_of) {
  std::vector<std::string> rows;
  for (const auto& name : names) {
    const Override forced(name);
    try {
      if (backend_of(q) == name) rows.push_back(name);
    } catch (const std::exception&) {  // "the <row> row cannot take ..."
    }
  }
  return rows;
}

inline std::vector<std::string> span_rows(const at::Tensor& q) {
  return rows_taking<ops::SpanBackendOverride>(ops::adaptive_span_attention_backends(), q,
                                               [](const at::Tensor& x) { return std::string(ops::adaptive_span_attention_backend(x)); });
}

inline std::vector<std::string> flash_rows(const at::Tensor& q) {
  return rows_taking<ops::FlashBackendOverride>(ops::flash_attention_backends(), q,
                                                [](const at::Tensor& x) { return std::string(ops::flash_attention_backend(x)); });
}

// The CUDA kernels' lab variants (src/ops/cuda/variants.h): every lab row of a table, so that a new
// variant is tested by adding its row.
template <typename Id, size_t N>
std::vector<std::string> lab_variants(const ops::cuda::KernelVariant<Id> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& row : table)
    if (row.lab) names.push_back(row.name);
  return names;
}

// SPANFORMER_SPAN_KERNEL or SPANFORMER_FLASH_KERNEL set for a scope (the glue reads it at each call),
// unset after it, also when a check throws.
struct KernelVariantEnv {
  const char* variable;
  KernelVariantEnv(const char* variable, const std::string& name) : variable(variable) {
    ::setenv(variable, name.c_str(), 1);
  }
  ~KernelVariantEnv() { ::unsetenv(variable); }
  KernelVariantEnv(const KernelVariantEnv&) = delete;
  KernelVariantEnv& operator=(const KernelVariantEnv&) = delete;
};

// The fused step ops (include/spanformer/ops/step_ops.h): rows of H not a multiple of a warp, one row,
// H beyond a warp's 32 x 8 elements; each activation dtype with parameters of that dtype and, on
// LibTorch 2.x, float32 (the master weights of autocast). `op(kernel, ...)` runs the kernels' path or
// the composition; outputs and every gradient within 2x the same-dtype composition's error of the
// double-precision composition.
struct StepCase {
  int64_t rows, H;
};
inline const std::vector<StepCase>& step_cases() {
  // 200 rows: four row blocks of the column sums (64 rows each, fp32 atomics across them); H 300 and
  // 1000: two and four column tiles of 256.
  static const std::vector<StepCase> cases = {{5, 32}, {37, 96}, {1, 40}, {9, 1000}, {200, 300}, {130, 1000}};
  return cases;
}
inline std::vector<std::pair<at::ScalarType, at::ScalarType>> step_dtypes() {  // (activations, parameters)
  std::vector<std::pair<at::ScalarType, at::ScalarType>> t{{at::kFloat, at::kFloat}, {at::kBFloat16, at::kBFloat16}};
#if SPANFORMER_HAS_CPU_HALF_MATMUL
  t.insert(t.end(), {{at::kBFloat16, at::kFloat}, {at::kHalf, at::kHalf}, {at::kHalf, at::kFloat}});
#endif
  return t;
}

using AddLayerNormRun = std::function<std::vector<at::Tensor>(bool kernel, const at::Tensor& x, const at::Tensor& r,
                                                              const at::Tensor& w, const at::Tensor& b)>;
inline void expect_add_layer_norm_within_reference_error(const AddLayerNormRun& op, at::Device device) {
  for (const auto& c : step_cases())
    for (const auto& [dtype, param_dtype] : step_dtypes()) {
      const std::string label = fmt::format("rows {} H {} params {}", c.rows, c.H, c10::toString(param_dtype));
      SCOPED_TRACE(label);
      at::manual_seed(c.rows * 1000 + c.H);
      const auto x = at::randn({c.rows, c.H}, at::kDouble), r = at::randn({c.rows, c.H}, at::kDouble);
      const auto w = 1 + 0.2 * at::randn({c.H}, at::kDouble), b = 0.1 * at::randn({c.H}, at::kDouble);
      const auto gs = at::randn({c.rows, c.H}, at::kDouble), gy = at::randn({c.rows, c.H}, at::kDouble);
      KernelRun run = [&, param_dtype = param_dtype](bool kernel, at::ScalarType t, at::Device on) {
        auto in = inputs_on({x, r}, t, on);
        auto params = inputs_on({w, b}, t == at::kDouble ? at::kDouble : param_dtype, on);
        const auto out = op(kernel, in[0], in[1], params[0], params[1]);  // s, y: (rows, H) each
        auto loss = (out[0].to(at::kCPU, at::kDouble) * gs).sum() + (out[1].to(at::kCPU, at::kDouble) * gy).sum();
        auto g = torch::autograd::grad({loss}, {in[0], in[1], params[0], params[1]});
        return std::vector<at::Tensor>{out[0].detach().cpu(), out[1].detach().cpu(), g[0].cpu(), g[1].cpu(), g[2].cpu(),
                                       g[3].cpu()};
      };
      expect_within_reference_error(run, {"sum", "norm", "x", "r", "weight", "bias"}, label, dtype, 2.0, device);
    }
}

using BiasGeluRun = std::function<at::Tensor(bool kernel, const at::Tensor& x, const at::Tensor& b, bool tanh)>;
inline void expect_bias_gelu_within_reference_error(const BiasGeluRun& op, at::Device device) {
  for (const bool tanh : {false, true})
    for (const auto& c : step_cases())
      for (const auto& [dtype, param_dtype] : step_dtypes()) {
        const std::string label =
            fmt::format("{} rows {} H {} bias {}", tanh ? "tanh" : "erf", c.rows, c.H, c10::toString(param_dtype));
        SCOPED_TRACE(label);
        at::manual_seed(c.rows * 1000 + c.H + 1);
        const auto x = 2 * at::randn({c.rows, c.H}, at::kDouble), b = at::randn({c.H}, at::kDouble);
        const auto gy = at::randn({c.rows, c.H}, at::kDouble);
        KernelRun run = [&, param_dtype = param_dtype](bool kernel, at::ScalarType t, at::Device on) {
          auto in = inputs_on({x}, t, on);
          auto bias = inputs_on({b}, t == at::kDouble ? at::kDouble : param_dtype, on);
          auto y = op(kernel, in[0], bias[0], tanh);  // (rows, H)
          auto g = torch::autograd::grad({(y.to(at::kCPU, at::kDouble) * gy).sum()}, {in[0], bias[0]});
          return std::vector<at::Tensor>{y.detach().cpu(), g[0].cpu(), g[1].cpu()};
        };
        expect_within_reference_error(run, {"gelu", "x", "bias"}, label, dtype, 2.0, device);
      }
}

}  // namespace spanformer::tu
