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

#include "spanformer/models/transformer_seq.h"
#include "spanformer/ops/adaptive_span_attention.h"
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

const char* kNames[] = {"out", "q", "k", "v", "key_pe", "span_ratio"};

void expect_within_reference_error(const CudaOpCase& c, at::ScalarType dtype, double factor) {
  const auto cuda = at::Device(at::kCUDA);
  const auto inputs = op_inputs(c, 11 + static_cast<uint64_t>(c.M));
  const auto o = op_options(c);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, at::kDouble);
  const auto truth = run_op(false, inputs, weights, at::kDouble, at::kCPU, o);
  const auto ref = run_op(false, inputs, weights, dtype, cuda, o);
  const auto fused = run_op(true, inputs, weights, dtype, cuda, o);
  for (size_t i = 0; i < truth.size(); ++i) {
    ASSERT_FALSE(fused[i].isnan().any().item<bool>()) << kNames[i] << ": NaN (an unwritten element?)";
    const double scale = std::max(1e-3, truth[i].abs().max().item<double>());
    const double ref_error = max_diff(ref[i], truth[i]) / scale, fused_error = max_diff(fused[i], truth[i]) / scale;
    // The floor: a few units in the last place of the dtype, where the reference happens to be exact.
    const double floor = dtype == at::kFloat ? 1e-6 : 1e-2;
    std::printf("measured: %s %-10s B%lld K%lld M%lld W%lld D%lld dropout %.1f: kernel %.3g, plain composition %.3g\n",
                dtype == at::kFloat ? "fp32" : "bf16", kNames[i], (long long)c.B, (long long)c.K, (long long)c.M,
                (long long)c.W, (long long)c.D, c.dropout, fused_error, ref_error);
    EXPECT_LE(fused_error, factor * std::max(ref_error, floor))
        << kNames[i] << ": kernel " << fused_error << ", plain composition " << ref_error << " (relative to max "
        << scale << ")";
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
    expect_within_reference_error(c, at::kFloat, 4.0);
  }
}

TEST(SpanAttentionCuda, BFloat16WithinTheBFloat16ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "B" << c.B << " K" << c.K << " M" << c.M << " W" << c.W << " D" << c.D);
    // The kernel reads bf16 and accumulates in fp32; the composition rounds its scores and softmax to
    // bf16 as well, so the kernel is expected below it; 2x leaves room for the final rounding.
    expect_within_reference_error(c, at::kBFloat16, 2.0);
  }
}

TEST(SpanAttentionCuda, DoubleFallsBackToTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const CudaOpCase c{1, 2, 20, 16, 32, 16, {4.0, 16.0}, 0.0};
  const auto inputs = op_inputs(c, 3);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, at::kDouble);
  const auto truth = run_op(false, inputs, weights, at::kDouble, at::kCPU, op_options(c));
  const auto gpu = run_op(true, inputs, weights, at::kDouble, at::Device(at::kCUDA), op_options(c));
  for (size_t i = 0; i < truth.size(); ++i) EXPECT_LT(max_diff(gpu[i], truth[i]), 1e-10) << kNames[i];
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

  // Loss and gradients of each of three steps.
  struct Trace {
    std::vector<double> loss;
    std::vector<std::vector<torch::Tensor>> grads;
  };
  auto train = [&](attention::AttnImpl impl, torch::Dtype dtype, torch::Device device) {
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
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 23}), y.reshape({-1})) + model->span_loss();
      for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
      loss.backward();
      trace.loss.push_back(loss.item<double>());
      std::vector<torch::Tensor> g;
      {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) {
          g.push_back(p.grad().detach().cpu().to(torch::kDouble));
          p.sub_(p.grad() * 0.5);
        }
      }
      trace.grads.push_back(g);
      model->clamp_spans();
      for (auto& cache : caches) cache = cache.detach();
    }
    return trace;
  };
  const auto truth = train(attention::AttnImpl::kPlain, torch::kDouble, torch::kCPU);
  const auto cpu32 = train(attention::AttnImpl::kPlain, torch::kFloat, torch::kCPU);
  for (auto impl : {attention::AttnImpl::kPlain, attention::AttnImpl::kFused}) {
    SCOPED_TRACE(attention::attn_impl_name(impl));
    const auto gpu = train(impl, torch::kFloat, torch::Device(torch::kCUDA));
    for (int step = 0; step < 3; ++step) {
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
