// CUDA paths against the references (label cuda; skipped where no GPU is visible). The kernels' cases
// and their measure (tests/op_cases.h) are shared with test_cuda_emulated.cpp, which runs the same
// kernels on the CPU model of CUDA in every CI run; model-level CUDA runs are held to the CPU in double.
#include <gtest/gtest.h>

#include <memory>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "spanformer/models/transformer_seq.h"
#include "spanformer/models/gpt.h"
#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"
#include "gpt_util.h"
#include "op_cases.h"
#include "spanformer/ops/step_ops.h"
#include "spanformer/train/optim.h"
#include "lab/step_graph.h"
#include "util.h"
#include "xl_util.h"

using namespace spanformer;

namespace {

using tu::max_diff;

// The op's CUDA path (the kernels for float32 / bfloat16 inputs).
at::Tensor span_kernel(const tu::Inputs& in, const ops::SpanAttentionOptions& o) {
  return ops::adaptive_span_attention(in[0], in[1], in[2], in[3], in[4], o);
}

at::Tensor flash_kernel(const tu::Inputs& in, const ops::FlashOptions& o) {
  return ops::flash_attention(in[0], in[1], in[2], o);
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

}  // namespace

TEST(SpanAttentionCuda, Float32WithinTheFloat32ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : tu::span_test_cases()) {
    SCOPED_TRACE(tu::span_label(c));
    // fp32 atomics accumulate the key-side gradients in another order than the composition's products.
    tu::expect_span_within_reference_error(c, at::kFloat, 4.0, at::Device(at::kCUDA), span_kernel);
  }
}

TEST(SpanAttentionCuda, BFloat16WithinTheBFloat16ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : tu::span_test_cases()) {
    SCOPED_TRACE(tu::span_label(c));
    // The kernel reads bf16 and accumulates in fp32; the composition rounds its scores and softmax to
    // bf16 as well, so the kernel is expected below it; 2x leaves room for the final rounding.
    tu::expect_span_within_reference_error(c, at::kBFloat16, 2.0, at::Device(at::kCUDA), span_kernel);
  }
}

TEST(SpanAttentionCuda, Float16WithinTheFloat16ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : tu::span_test_cases()) {
    SCOPED_TRACE(tu::span_label(c));
    // As bf16, with 3 more mantissa bits on both sides.
    tu::expect_span_within_reference_error(c, at::kHalf, 2.0, at::Device(at::kCUDA), span_kernel);
  }
}

// The forward's lab variants (src/ops/cuda/variants.h, every lab row: v1b2-async, v1b2-shortcuts).
TEST(SpanAttentionCuda, LabVariantsWithinTheReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& variant : tu::lab_variants(ops::cuda::kSpanVariants)) {
    SCOPED_TRACE(variant);
    const tu::KernelVariantEnv env("SPANFORMER_SPAN_KERNEL", variant);
    for (const auto& c : tu::span_test_cases()) {
      SCOPED_TRACE(tu::span_label(c));
      tu::expect_span_within_reference_error(c, at::kBFloat16, 2.0, at::Device(at::kCUDA), span_kernel);
      tu::expect_span_within_reference_error(c, at::kHalf, 2.0, at::Device(at::kCUDA), span_kernel);
    }
  }
}

TEST(SpanAttentionCuda, DoubleFallsBackToTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const tu::SpanCase c{1, 2, 20, 16, 32, 16, {4.0, 16.0}, 0.0};
  at::manual_seed(3);
  auto o64 = at::TensorOptions().dtype(at::kDouble);
  const tu::Inputs inputs = {at::randn({c.B, c.K, c.M, c.D}, o64), at::randn({c.B, c.K, c.W + c.M, c.D}, o64),
                             at::randn({c.B, c.K, c.W + c.M, c.D}, o64), at::randn({c.D, c.L}, o64),
                             at::tensor({4.0 / 16, 1.0}, o64)};
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, o64);
  auto run = [&](at::Device d) {
    const auto in = tu::inputs_on(inputs, at::kDouble, d);
    return tu::output_and_gradients(span_kernel(in, tu::span_options(c)), in, weights);
  };
  const auto truth = run(at::kCPU), gpu = run(at::Device(at::kCUDA));
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

TEST(FlashCuda, Float32WithinTheFloat32ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // The kernels sum scores and values in another order than the composition's products: 4x.
  for (const auto& c : tu::flash_test_cases())
    tu::expect_flash_within_reference_error(c, at::kFloat, 4.0, at::Device(at::kCUDA), flash_kernel);
}

TEST(FlashCuda, BFloat16WithinTheBFloat16ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // bf16 inputs, fp32 arithmetic in the kernels; the composition rounds scores and weights to bf16.
  for (const auto& c : tu::flash_test_cases())
    tu::expect_flash_within_reference_error(c, at::kBFloat16, 2.0, at::Device(at::kCUDA), flash_kernel);
}

TEST(FlashCuda, Float16WithinTheFloat16ReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : tu::flash_test_cases())
    tu::expect_flash_within_reference_error(c, at::kHalf, 2.0, at::Device(at::kCUDA), flash_kernel);
}

// The lab variants (src/ops/cuda/variants.h, every lab row): the key-major backward (v1-keys) and the
// forward with 32 rows a warp (v1-m2) at D 32 and 64, the forward with cp.async double-buffered tiles
// (v1-async) at every D.
TEST(FlashCuda, LabVariantsWithinTheReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& variant : tu::lab_variants(ops::cuda::kFlashVariants)) {
    SCOPED_TRACE(variant);
    const tu::KernelVariantEnv env("SPANFORMER_FLASH_KERNEL", variant);
    for (const auto& c : tu::flash_test_cases()) {
      tu::expect_flash_within_reference_error(c, at::kBFloat16, 2.0, at::Device(at::kCUDA), flash_kernel);
      tu::expect_flash_within_reference_error(c, at::kHalf, 2.0, at::Device(at::kCUDA), flash_kernel);
    }
  }
}

// The bf16 and fp16 tests above run version 1 (tensor cores) where it applies (D 32, 64, 128); here every
// case takes version 0 (SPANFORMER_FLASH_KERNEL=v0), which fp32 and the other widths run.
TEST(FlashCuda, Version0WithinTheReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const tu::KernelVariantEnv env("SPANFORMER_FLASH_KERNEL", "v0");
  for (const auto& c : tu::flash_test_cases()) {
    tu::expect_flash_within_reference_error(c, at::kBFloat16, 2.0, at::Device(at::kCUDA), flash_kernel);
    tu::expect_flash_within_reference_error(c, at::kHalf, 2.0, at::Device(at::kCUDA), flash_kernel);
  }
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
  // Each kind with the step ops' composition and with the fused step kernels (include/spanformer/ops/step_ops.h).
  for (const char* step_ops : {"composition", "kernels"}) {
    for (auto kind : {CausalKind::kDense, CausalKind::kFlash, CausalKind::kWindow, CausalKind::kAdaptiveSpan,
                      CausalKind::kSparseStrided, CausalKind::kSparseFixed}) {
      SCOPED_TRACE(std::string(attention::causal_kind_name(kind)) + ", step ops " + step_ops);
      const tu::KernelVariantEnv env("SPANFORMER_STEP_KERNELS", step_ops);
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
}

// The lab's CUDA graphs (lab/step_graph.h): a GPT's training steps (dense attention, dropout, AdamW
// with a rate that changes every step, clipping) replayed from the captured graph equal the same steps
// run eagerly through the same code, bit for bit: every loss and every parameter after 8 steps.
TEST(GraphCuda, ReplayEqualsEagerBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device device(torch::kCUDA);
  const int64_t T = 32, steps = 8;
  torch::manual_seed(3);
  const auto tokens = torch::randint(11, {steps, 2, T + 1}, torch::kLong);  // (steps, B, T + 1)
  auto run = [&](int64_t warmup) {
    auto config = tu::tiny_gpt(attention::CausalKind::kDense, T).model;
    torch::manual_seed(6);
    models::GptModel model(config);
    model->to(device);
    model->train();
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    train::Optimizer optimizer(named, {OptimKind::kAdamW, 0.0, /*grad_clip=*/0.5, /*weight_decay=*/0.1, 0.99});
    EXPECT_EQ(optimizer.graph_refusal(), "");
    lab::StepGraph graph(device, warmup);
    std::vector<double> losses;
    for (int64_t s = 0; s < steps; ++s) {
      auto x = tokens[s].narrow(1, 0, T).to(device), y = tokens[s].narrow(1, 1, T).to(device);  // (B, T)
      optimizer.begin_graph_step(1e-3 * static_cast<double>(s + 1));
      auto loss = graph.run(x, y, [&](const torch::Tensor& gx, const torch::Tensor& gy) {
        optimizer.zero_grad();
        auto logits = model->logits(model->forward(gx));  // (B, T, 11)
        auto nll = torch::cross_entropy_loss(logits.reshape({-1, 11}), gy.reshape({-1}));
        nll.backward();
        optimizer.graph_step();
        return nll.detach();
      });
      losses.push_back(loss.item<double>());
    }
    EXPECT_EQ(graph.captured(), warmup < steps);
    std::vector<torch::Tensor> params;
    for (const auto& p : model->parameters()) params.push_back(p.detach().cpu());
    return std::pair{losses, params};
  };
  const auto eager = run(1000), replayed = run(lab::StepGraph::kWarmup);
  for (int64_t s = 0; s < steps; ++s) EXPECT_EQ(eager.first[s], replayed.first[s]) << "step " << s + 1;
  for (size_t i = 0; i < eager.second.size(); ++i)
    EXPECT_TRUE(torch::equal(eager.second[i], replayed.second[i])) << "parameter " << i;
}

// The lab's graph timings (spanformer_tests --graph-perf): what a graph cannot capture, and a machine
// without a GPU, are one line each, before any model is built.
TEST(GraphPerf, RefusesWhatCannotBeCapturedInOneLine) {
  tu::TempDir tmp;
  auto config = [&](const std::string& name, const std::string& text) {
    tu::write_text(tmp.file(name), text);
    return tmp.file(name);
  };
  const std::string model = R"("arch": "gpt", "model": {"n_layer": 1, "d_model": 16, "n_head": 2, "context": 16, "vocab_size": 11)";
  EXPECT_EQ(tu::error_of([&] {
              lab::graph_perf_main({"--config", config("w.json", "{" + model + R"(, "attention": "window", "window": 4}, "train": {"optim": "adamw"}})")});
            }),
            "--graph-perf: cannot capture this gpt step: its window attention is not captured (dense and flash are)");
  EXPECT_EQ(tu::error_of([&] { lab::graph_perf_main({"--config", config("a.json", "{" + model + R"(}, "train": {"optim": "adagrad"}})")}); }),
            "--graph-perf: cannot capture this gpt step: train.optim is adagrad; the captured update is Adam's or AdamW's");
  EXPECT_EQ(tu::error_of([&] { lab::graph_perf_main({"--rounds"}); }),
            "--graph-perf: --rounds needs a value (--config FILE, --amp bf16|off, --rounds N, --steps N)");
  if (!torch::cuda::is_available())
    EXPECT_EQ(tu::error_of([&] { lab::graph_perf_main({"--config", config("d.json", "{" + model + R"(}, "train": {"optim": "adamw"}})")}); }),
              "--graph-perf needs a CUDA device (none is visible)");
}

// The lab's CUDA graphs: each new token's fixed-shape step (models/gpt.h) replayed as a CUDA graph
// gives the hidden states of the same step run eagerly, bit for bit, through two context slides (the
// prompt and each slide refill the buffers the graph reads); both within float rounding of the
// growing KV cache. Dense and window attention (a band the mask must honour).
TEST(GraphCuda, GenerationReplayEqualsEagerBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device device(torch::kCUDA);
  const int64_t T = 24;
  for (auto kind : {attention::CausalKind::kDense, attention::CausalKind::kWindow}) {
    SCOPED_TRACE(attention::causal_kind_name(kind));
    torch::manual_seed(6);
    models::GptModel model(tu::tiny_gpt(kind, T).model);
    model->to(device);
    model->eval();
    torch::NoGradGuard no_grad;
    torch::manual_seed(4);
    const auto tokens = torch::randint(11, {1, 60}, torch::kLong).to(device);
    auto run = [&](int64_t warmup, bool fixed_shapes) {
      lab::StepGraph graph(device, warmup, "generation as a CUDA graph");
      models::GptDecoder d;
      d.fixed_shapes = fixed_shapes;
      if (fixed_shapes)
        d.runner = [&](const torch::Tensor& x, const torch::Tensor& at, const models::GptStepFn& step) {
          return graph.run(x, at, step);
        };
      std::vector<torch::Tensor> hidden{model->extend(tokens.narrow(1, 0, 10), d).cpu()};
      for (int64_t i = 10; i < 60; ++i) hidden.push_back(model->extend(tokens.narrow(1, i, 1), d).cpu());
      if (fixed_shapes) EXPECT_EQ(graph.captured(), warmup < 50);
      return hidden;
    };
    const auto growing = run(1000, false), eager = run(1000, true), replayed = run(lab::StepGraph::kWarmup, true);
    for (size_t i = 0; i < eager.size(); ++i) {
      EXPECT_TRUE(torch::equal(eager[i], replayed[i])) << "call " << i;
      EXPECT_LT((eager[i] - growing[i]).abs().max().item<double>(), 1e-5) << "call " << i;
    }
  }
}

// The lab's fused step kernels (lab/cuda/step_kernels.cu) through the public ops, SPANFORMER_STEP_KERNELS
// = kernels against the composition, every step case of tests/op_cases.h.
TEST(StepKernelsCuda, WithinTheReferenceError) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto forced = [](bool kernel) {
    return std::make_unique<tu::KernelVariantEnv>("SPANFORMER_STEP_KERNELS", kernel ? "kernels" : "composition");
  };
  tu::expect_add_layer_norm_within_reference_error(
      [&](bool kernel, const at::Tensor& x, const at::Tensor& r, const at::Tensor& w, const at::Tensor& b) {
        const auto env = forced(kernel);
        EXPECT_EQ(ops::step_kernels_take(x), kernel && x.is_cuda());
        const auto f = ops::add_layer_norm(x, r, w, b, 1e-5);
        return std::vector<at::Tensor>{f.sum, f.out};
      },
      at::Device(at::kCUDA));
  tu::expect_bias_gelu_within_reference_error(
      [&](bool kernel, const at::Tensor& x, const at::Tensor& b, bool tanh) {
        const auto env = forced(kernel);
        return ops::bias_gelu(x, b, tanh);
      },
      at::Device(at::kCUDA));
}

// train.amp = bf16 on CUDA through the runner (tests/util.h, expect_bf16_run): a small GPT with flash
// attention on both paths (fused: the CUDA kernels reading bf16), the adaptive-span model and a
// Transformer-XL with the adaptive embedding and softmax (CUDA's autocast narrows the products that the
// CPU's leaves in fp32: the first GPU run of `bench --amp=bf16` found the embedding's clusters failing
// there), within 3% of the float32 run's losses, float32 weights in the checkpoint.
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
  for (auto impl : {attention::AttnImpl::kPlain, attention::AttnImpl::kFused}) {  // fused: kernel v1's forward in bf16
    SCOPED_TRACE(std::string("adaptive span ") + attention::attn_impl_name(impl));
    AdaptiveSpanConfig a;
    a.model.nb_layers = 2;
    a.model.hidden_size = 64;
    a.model.inner_hidden_size = 128;
    a.model.nb_heads = 2;
    a.model.attn_span = 64;
    a.model.block_size = 32;
    a.model.attn_impl = impl;
    a.train.data = tmp.path();
    a.train.device = "cuda";
    a.train.batch_size = 8;
    a.train.nb_steps = 30;
    a.train.lr_warmup = 5;  // the default 8000 leaves the weights where they started (equal valid figures)
    a.train.eval_interval = 15;
    a.train.eval_blocks = 2;
    tu::expect_bf16_run(to_json(a), tmp.file(std::string("adaptive_span_") + attention::attn_impl_name(impl)), -1, 0.03);
  }
  XlConfig x;
  x.model = xl_test::tiny_config();
  x.model.vocab_size = 0;
  x.model.adaptive = true;
  x.model.cutoffs = {20, 40};
  x.model.div_val = 2;
  x.train.data = tmp.path();
  x.train.device = "cuda";
  x.train.batch_size = 8;
  x.train.nb_steps = 30;
  x.train.lr = 3e-3;
  x.train.lr_warmup = 5;
  x.train.eval_interval = 15;
  x.train.eval_blocks = 2;
  tu::expect_bf16_run(to_json(x), tmp.file("xl"), -1, 0.03);
}
