// CUDA paths against the references (label cuda; skipped where no GPU is visible).
//
// Tolerances are relative to the error of the same-precision reference computed on the same device:
// the double-precision reference composition on the CPU is the truth, and a CUDA result may be at most
// a small multiple of the plain float32 (or bfloat16) composition's own distance from it. A kernel that
// drops a term, reads the wrong key or leaves an output unwritten misses by orders of magnitude.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "spanformer/models/transformer_seq.h"
#include "spanformer/models/gpt.h"
#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"
#include "gpt_util.h"
#include "util.h"

using namespace spanformer;

namespace {

using tu::max_diff;

struct CudaOpCase {
  int64_t B, K, M, W, D, L;
  std::vector<double> spans;  // z per head, tokens
  double dropout;
};

// The op's inputs (q, k, v, key_pe, span_ratio) in double on the CPU, fresh random values per case.
std::vector<at::Tensor> op_inputs(const CudaOpCase& c, uint64_t seed) {
  at::manual_seed(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  std::vector<double> ratios;
  for (double z : c.spans) ratios.push_back(z / static_cast<double>(c.L));
  return {at::randn({c.B, c.K, c.M, c.D}, o), at::randn({c.B, c.K, c.W + c.M, c.D}, o),
          at::randn({c.B, c.K, c.W + c.M, c.D}, o), at::randn({c.D, c.L}, o), at::tensor(ratios, o)};
}

ops::SpanAttentionOptions op_options(const CudaOpCase& c) {
  ops::SpanAttentionOptions o;
  o.attn_span = c.L;
  o.ramp = 8;
  o.dropout = c.dropout;
  o.training = c.dropout > 0;
  o.seed = 4321;
  return o;
}

// Output and the gradients of sum(out * weights) with respect to every input.
std::vector<at::Tensor> run_op(bool fused, const std::vector<at::Tensor>& inputs, const at::Tensor& weights,
                               at::ScalarType dtype, at::Device device, const ops::SpanAttentionOptions& o) {
  std::vector<at::Tensor> in;
  for (const auto& t : inputs) in.push_back(t.to(device, dtype).requires_grad_(true));
  {  // Poison the caching allocator's next blocks: an output element the kernel never writes shows as NaN.
    auto poison = at::full({in[0].numel() * 4}, NAN, in[0].options().requires_grad(false));
  }
  auto out = fused ? ops::adaptive_span_attention(in[0], in[1], in[2], in[3], in[4], o)
                   : ops::adaptive_span_attention_reference(in[0], in[1], in[2], in[3], in[4], o);
  auto grads = torch::autograd::grad({(out.to(at::kDouble) * weights.to(device)).sum()}, in);
  std::vector<at::Tensor> result = {out.detach()};
  for (auto& g : grads) result.push_back(g);
  return result;
}

// Output and gradients of one implementation (fused: the CUDA kernels; else the plain composition)
// in one dtype on one device.
using Run = std::function<std::vector<at::Tensor>(bool fused, at::ScalarType dtype, at::Device device)>;

// Each output of the kernels on CUDA within `factor` times the same-dtype composition's own distance
// from the double-precision CPU reference (relative to the largest magnitude of the reference).
void expect_within_reference_error(const Run& run, const std::vector<std::string>& names, const std::string& label,
                                   at::ScalarType dtype, double factor) {
  const auto cuda = at::Device(at::kCUDA);
  const auto truth = run(false, at::kDouble, at::kCPU);
  const auto ref = run(false, dtype, cuda);
  const auto fused = run(true, dtype, cuda);
  for (size_t i = 0; i < truth.size(); ++i) {
    ASSERT_FALSE(fused[i].isnan().any().item<bool>()) << names[i] << ": NaN (an unwritten element?)";
    const double scale = std::max(1e-3, truth[i].abs().max().item<double>());
    const double ref_error = max_diff(ref[i], truth[i]) / scale, fused_error = max_diff(fused[i], truth[i]) / scale;
    // The floor: a few units in the last place of the dtype, where the reference happens to be exact.
    const double floor = dtype == at::kFloat ? 1e-6 : 1e-2;
    std::printf("measured: %s %-10s %s: kernel %.3g, plain composition %.3g\n", dtype == at::kFloat ? "fp32" : "bf16",
                names[i].c_str(), label.c_str(), fused_error, ref_error);
    EXPECT_LE(fused_error, factor * std::max(ref_error, floor))
        << names[i] << ": kernel " << fused_error << ", plain composition " << ref_error << " (relative to max "
        << scale << ")";
  }
}

void expect_span_within_reference_error(const CudaOpCase& c, at::ScalarType dtype, double factor) {
  const auto inputs = op_inputs(c, 11 + static_cast<uint64_t>(c.M));
  const auto o = op_options(c);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, at::kDouble);
  const auto label = fmt::format("B{} K{} M{} W{} D{} dropout {}", c.B, c.K, c.M, c.W, c.D, c.dropout);
  expect_within_reference_error(
      [&](bool fused, at::ScalarType t, at::Device d) { return run_op(fused, inputs, weights, t, d, o); },
      {"out", "q", "k", "v", "key_pe", "span_ratio"}, label, dtype, factor);
}

// Losses and gradients (double, on the CPU) of a few training steps.
struct Trace {
  std::vector<double> loss;
  std::vector<std::vector<torch::Tensor>> grads;
};

// Backward of `loss`, recorded into `trace`, then plain SGD (p -= 0.5 grad).
void sgd_step(torch::nn::Module& model, torch::Tensor loss, Trace& trace) {
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
  loss.backward();
  trace.loss.push_back(loss.item<double>());
  std::vector<torch::Tensor> g;
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    g.push_back(p.grad().detach().cpu().to(torch::kDouble));
    p.sub_(p.grad() * 0.5);
  }
  trace.grads.push_back(g);
}

// The run on CUDA in float32 (plain and fused attention) against the same run in double on the CPU:
// each loss and gradient within 4x the float32 CPU run's own distance from the double run.
void expect_cuda_training_within_float32_error(
    const std::function<Trace(attention::AttnImpl, torch::Dtype, torch::Device)>& train) {
  const auto truth = train(attention::AttnImpl::kPlain, torch::kDouble, torch::kCPU);
  const auto cpu32 = train(attention::AttnImpl::kPlain, torch::kFloat, torch::kCPU);
  for (auto impl : {attention::AttnImpl::kPlain, attention::AttnImpl::kFused}) {
    SCOPED_TRACE(attention::attn_impl_name(impl));
    const auto gpu = train(impl, torch::kFloat, torch::Device(torch::kCUDA));
    for (size_t step = 0; step < truth.loss.size(); ++step) {
      const double cpu_loss_error = std::abs(cpu32.loss[step] - truth.loss[step]);
      EXPECT_LE(std::abs(gpu.loss[step] - truth.loss[step]), 4 * std::max(cpu_loss_error, 1e-6 * truth.loss[step]))
          << "loss of step " << step;
      for (size_t i = 0; i < truth.grads[step].size(); ++i) {
        const double scale = std::max(1e-6, truth.grads[step][i].abs().max().item<double>());
        const double cpu_error = max_diff(cpu32.grads[step][i], truth.grads[step][i]) / scale;
        const double gpu_error = max_diff(gpu.grads[step][i], truth.grads[step][i]) / scale;
        EXPECT_LE(gpu_error, 4 * std::max(cpu_error, 1e-5)) << "parameter " << i << " at step " << step;
      }
    }
  }
}

// Spans away from the mask's kinks (z - (d - 1) = 0 or -R for an integer distance d): there a ratio
// rounded to float32 or bfloat16 moves one distance in or out of the ramp, and the span gradient with it.
const std::vector<CudaOpCase> kCases = {
    {2, 2, 70, 40, 64, 100, {3.5, 90.0}, 0.0},          // M not a multiple of anything; spans short and long
    {1, 3, 130, 64, 32, 64, {0.0, 20.25, 64.0}, 0.0},  // span 0, the whole window, D 32
    {2, 2, 33, 30, 128, 30, {12.4, 2.3}, 0.0},          // D 128, window = L
    {1, 2, 40, 48, 256, 48, {46.6, 5.3}, 0.0},          // D 256, the largest the kernel takes
    {1, 2, 66, 20, 32, 40, {10.4, 30.0}, 0.3},          // dropout (same hash stream on every device)
};

}  // namespace

TEST(SpanAttentionCuda, Float32WithinTheFloat32ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "B" << c.B << " K" << c.K << " M" << c.M << " W" << c.W << " D" << c.D);
    // fp32 atomics accumulate the key-side gradients in another order than the composition's products.
    expect_span_within_reference_error(c, at::kFloat, 4.0);
  }
}

TEST(SpanAttentionCuda, BFloat16WithinTheBFloat16ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "B" << c.B << " K" << c.K << " M" << c.M << " W" << c.W << " D" << c.D);
    // The kernel reads bf16 and accumulates in fp32; the composition rounds its scores and softmax to
    // bf16 as well, so the kernel is expected below it; 2x leaves room for the final rounding.
    expect_span_within_reference_error(c, at::kBFloat16, 2.0);
  }
}

TEST(SpanAttentionCuda, DoubleFallsBackToTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const CudaOpCase c{1, 2, 20, 16, 32, 16, {4.0, 16.0}, 0.0};
  const auto inputs = op_inputs(c, 3);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, at::kDouble);
  const auto truth = run_op(false, inputs, weights, at::kDouble, at::kCPU, op_options(c));
  const auto gpu = run_op(true, inputs, weights, at::kDouble, at::Device(at::kCUDA), op_options(c));
  for (size_t i = 0; i < truth.size(); ++i) EXPECT_LT(max_diff(gpu[i], truth[i]), 1e-10) << "output " << i;
}

// A small adaptive-span LM trained for three blocks with carried caches and plain SGD: the CUDA run
// (plain and fused attention) against the same run in double on the CPU, with the float32 CPU run as the
// measure of what float32 costs.
TEST(ModelCuda, TrainingStepsMatchTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ModelConfig config;
  config.vocab_size = 23;
  config.nb_layers = 2;
  config.hidden_size = 64;
  config.inner_hidden_size = 128;
  config.nb_heads = 2;  // head width 32: the CUDA kernel's smallest
  config.attn_span = 96;
  config.block_size = 32;
  config.adapt_span_ramp = 8;
  config.adapt_span_init = 0.3;
  config.adapt_span_loss = 1e-3;
  torch::manual_seed(5);
  const auto tokens = torch::randint(23, {2, 3 * 32 + 1}, torch::kLong);

  expect_cuda_training_within_float32_error([&](attention::AttnImpl impl, torch::Dtype dtype, torch::Device device) {
    auto c = config;
    c.attn_impl = impl;
    torch::manual_seed(6);
    models::TransformerSeq model(c);
    model->to(device, dtype);
    model->train();
    auto caches = model->initial_caches(2);
    Trace trace;
    for (int step = 0; step < 3; ++step) {
      auto x = tokens.narrow(1, 32 * step, 32).to(device), y = tokens.narrow(1, 32 * step + 1, 32).to(device);
      auto logits = model->logits(model->forward(x, caches));
      sgd_step(*model, torch::nn::functional::cross_entropy(logits.reshape({-1, 23}), y.reshape({-1})) + model->span_loss(),
               trace);
      model->clamp_spans();
      for (auto& cache : caches) cache = cache.detach();
    }
    return trace;
  });
}

namespace {

// Flash attention: q (B, K, N, D), k and v (B, K, C, D), the keys' band (0 = dense) and dropout.
struct FlashCudaCase {
  int64_t B, K, N, C, D, band;
  double dropout;
};

const std::vector<FlashCudaCase> kFlashCases = {
    {2, 3, 70, 70, 64, 0, 0.0},      // N not a multiple of the 8-row blocks or the 32-key tiles
    {1, 2, 37, 100, 32, 0, 0.0},     // a KV cache: 63 earlier keys
    {2, 2, 130, 130, 128, 17, 0.0},  // a sliding window of 17 keys
    {1, 2, 40, 40, 256, 0, 0.0},     // D 256, the largest the kernels take
    {1, 2, 66, 66, 48, 0, 0.3},      // dropout (the same hash stream as the CPU); D not a multiple of 32
    {1, 1, 1, 50, 64, 0, 0.0},       // one query over a cache (generation)
};

void expect_flash_within_reference_error(const FlashCudaCase& c, at::ScalarType dtype, double factor) {
  at::manual_seed(17 + static_cast<uint64_t>(c.N));
  auto o64 = at::TensorOptions().dtype(at::kDouble);
  const std::vector<at::Tensor> inputs = {at::randn({c.B, c.K, c.N, c.D}, o64), at::randn({c.B, c.K, c.C, c.D}, o64),
                                          at::randn({c.B, c.K, c.C, c.D}, o64)};
  const auto weights = at::randn({c.B, c.K, c.N, c.D}, o64);
  ops::FlashOptions o;
  o.band = c.band;
  o.dropout = c.dropout;
  o.training = c.dropout > 0;
  o.seed = 4321;
  o.cuda_kernel = true;
  auto run = [&](bool fused, at::ScalarType t, at::Device d) {
    std::vector<at::Tensor> in;
    for (const auto& x : inputs) in.push_back(x.to(d, t).requires_grad_(true));
    {  // Poison the caching allocator's next blocks: an element the kernels never write shows as NaN.
      auto poison = at::full({in[1].numel() * 4}, NAN, in[1].options().requires_grad(false));
    }
    auto out = fused ? ops::flash_attention(in[0], in[1], in[2], o) : ops::flash_attention_reference(in[0], in[1], in[2], o);
    auto grads = torch::autograd::grad({(out.to(at::kDouble) * weights.to(d)).sum()}, in);
    std::vector<at::Tensor> result = {out.detach()};
    for (auto& g : grads) result.push_back(g);
    return result;
  };
  const auto label = fmt::format("B{} K{} N{} C{} D{} band {} dropout {}", c.B, c.K, c.N, c.C, c.D, c.band, c.dropout);
  expect_within_reference_error(run, {"out", "q", "k", "v"}, label, dtype, factor);
}

}  // namespace

TEST(FlashCuda, Float32WithinTheFloat32ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // The kernels sum scores and values in another order than the composition's products: 4x.
  for (const auto& c : kFlashCases) expect_flash_within_reference_error(c, at::kFloat, 4.0);
}

TEST(FlashCuda, BFloat16WithinTheBFloat16ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // bf16 inputs, fp32 arithmetic in the kernels; the composition rounds scores and weights to bf16.
  for (const auto& c : kFlashCases) expect_flash_within_reference_error(c, at::kBFloat16, 2.0);
}

// A small GPT trained for three steps with plain SGD, every attention with a fixed pattern and both
// implementations (fused flash = the CUDA kernels), on CUDA in float32 against the same run in double on
// the CPU, with the float32 CPU run as the measure of what float32 costs. (lsh draws its rotations from
// the device's generator, so the devices cannot share them.)
TEST(GptCuda, TrainingStepsMatchTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  using attention::CausalKind;
  torch::manual_seed(5);
  const int64_t T = 80;
  const auto tokens = torch::randint(11, {2, T + 1}, torch::kLong);
  for (auto kind : {CausalKind::kDense, CausalKind::kFlash, CausalKind::kWindow, CausalKind::kAdaptiveSpan,
                    CausalKind::kSparseStrided, CausalKind::kSparseFixed}) {
    SCOPED_TRACE(attention::causal_kind_name(kind));
    expect_cuda_training_within_float32_error([&](attention::AttnImpl impl, torch::Dtype dtype, torch::Device device) {
      auto config = tu::tiny_gpt(kind, T).model;
      config.d_model = 64;  // 2 heads of 32
      config.window = 20;
      config.sparse_stride = 9;
      config.adapt_span_init = 0.3;
      config.attn_impl = impl;
      torch::manual_seed(6);
      models::GptModel model(config);
      model->to(device, dtype);
      model->clamp_spans();
      model->train();
      Trace trace;
      auto x = tokens.narrow(1, 0, T).to(device), y = tokens.narrow(1, 1, T).to(device);
      for (int step = 0; step < 3; ++step) {
        auto logits = model->logits(model->forward(x));
        sgd_step(*model, torch::cross_entropy_loss(logits.reshape({-1, 11}), y.reshape({-1})) + model->span_loss(), trace);
        model->clamp_spans();
      }
      return trace;
    });
  }
}

// train.amp = bf16 on CUDA through the runner (tests/util.h, expect_bf16_run): a small GPT with flash
// attention on both paths (fused: the CUDA kernels reading bf16) and the adaptive-span model, within 3%
// of the float32 run's losses, float32 weights in the checkpoint.
TEST(MixedPrecisionCuda, Bf16RunsStayCloseToFloat32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 30000);
  for (auto impl : {attention::AttnImpl::kPlain, attention::AttnImpl::kFused}) {
    SCOPED_TRACE(attention::attn_impl_name(impl));
    GptConfig c = tu::tiny_gpt(attention::CausalKind::kFlash, 64);
    c.model.vocab_size = 0;
    c.model.d_model = 64;  // heads of 32
    c.model.attn_impl = impl;
    c.train.data = tmp.path();
    c.train.device = "cuda";
    c.train.batch_size = 8;
    c.train.nb_steps = 30;
    c.train.lr = 3e-3;
    c.train.lr_warmup = 5;
    c.train.eval_interval = 15;
    c.train.eval_blocks = 2;
    tu::expect_bf16_run(to_json(c), tmp.file(std::string("gpt_") + attention::attn_impl_name(impl)), -1, 0.03);
  }
  Config a;
  a.model.nb_layers = 2;
  a.model.hidden_size = 64;
  a.model.inner_hidden_size = 128;
  a.model.nb_heads = 2;
  a.model.attn_span = 64;
  a.model.block_size = 32;
  a.train.data = tmp.path();
  a.train.device = "cuda";
  a.train.batch_size = 8;
  a.train.nb_steps = 30;
  a.train.eval_interval = 15;
  a.train.eval_blocks = 2;
  tu::expect_bf16_run(to_json(a), tmp.file("adaptive_span"), -1, 0.03);
}
