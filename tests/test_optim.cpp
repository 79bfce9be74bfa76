// Optimizer updates and the warmup schedule against plain per-element loops in double.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <cmath>

#include "op_cases.h"
#include "spanformer/train/optim.h"
#include "spanformer/util/torch_compat.h"

using namespace spanformer::train;
using spanformer::OptimKind;
using spanformer::TrainConfig;
using spanformer::learning_rate;
using spanformer::optim_name;

namespace {
struct Params {
  std::vector<torch::Tensor> tensors;
  std::vector<std::pair<std::string, torch::Tensor>> named() {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (size_t i = 0; i < tensors.size(); ++i) out.emplace_back("p" + std::to_string(i), tensors[i]);
    return out;
  }
};
Params make_params() {
  torch::manual_seed(5);
  Params p;
  for (int64_t n : {3, 7, 1}) {
    auto t = torch::randn({n}, torch::kDouble).requires_grad_(true);
    p.tensors.push_back(t);
  }
  return p;
}
void set_grads(Params& p, double scale) {
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    // Tensor 0 gets a large gradient (clipped), tensor 1 a small one (not clipped).
    p.tensors[i].mutable_grad() = torch::randn_like(p.tensors[i]) * (i == 0 ? scale : 0.001);
  }
}
}  // namespace

// Double-precision parameters take the plain composition (ATen's fused kernels serve float32 and 16-bit
// ones; FusedKernelsEqualThePlainCompositionInFloat holds them to this path).
TEST(Optim, AdagradWithReferenceClipMatchesPlainLoop) {
  auto p = make_params();
  const double lr = 0.07, clip = 0.03;
  Optimizer opt(p.named(), {OptimKind::kAdagrad, 0.0, clip});
  std::vector<std::vector<double>> x(p.tensors.size()), sum(p.tensors.size());
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    for (int64_t j = 0; j < p.tensors[i].numel(); ++j) x[i].push_back(p.tensors[i][j].item<double>());
    sum[i].assign(x[i].size(), 0.0);
  }
  for (int step = 1; step <= 3; ++step) {
    set_grads(p, 1.0);
    for (size_t i = 0; i < p.tensors.size(); ++i) {
      auto g = p.tensors[i].grad();
      double norm = 0;
      for (int64_t j = 0; j < g.numel(); ++j) norm += g[j].item<double>() * g[j].item<double>();
      norm = std::sqrt(norm);
      const double clr = norm > clip ? lr * clip / (norm + 1e-10) : lr;
      for (int64_t j = 0; j < g.numel(); ++j) {
        const double gj = g[j].item<double>();
        sum[i][j] += gj * gj;  // unclipped gradient in the accumulator
        x[i][j] -= clr * gj / (std::sqrt(sum[i][j]) + 1e-10);
      }
    }
    opt.step(lr);
    for (size_t i = 0; i < p.tensors.size(); ++i)
      for (int64_t j = 0; j < p.tensors[i].numel(); ++j)
        EXPECT_NEAR(p.tensors[i][j].item<double>(), x[i][j], 1e-14) << "step " << step;
  }
}

TEST(Optim, SgdMomentumAndAdamWithGlobalClipMatchPlainLoops) {
  for (OptimKind kind : {OptimKind::kSgd, OptimKind::kAdam}) {
    auto p = make_params();
    const double lr = 0.01, clip = 0.25, momentum = 0.9;
    Optimizer opt(p.named(), {kind, momentum, clip});
    std::vector<double> x, m, v;
    for (auto& t : p.tensors)
      for (int64_t j = 0; j < t.numel(); ++j) x.push_back(t[j].item<double>());
    m.assign(x.size(), 0);
    v.assign(x.size(), 0);
    for (int step = 1; step <= 3; ++step) {
      set_grads(p, 10.0);
      std::vector<double> g;
      for (auto& t : p.tensors)
        for (int64_t j = 0; j < t.numel(); ++j) g.push_back(t.grad()[j].item<double>());
      double total = 0;
      for (double gi : g) total += gi * gi;
      const double coef = std::min(1.0, clip / (std::sqrt(total) + 1e-6));
      for (size_t i = 0; i < g.size(); ++i) {
        const double gi = g[i] * coef;
        if (kind == OptimKind::kSgd) {
          m[i] = step == 1 ? gi : momentum * m[i] + gi;
          x[i] -= lr * m[i];
        } else {
          m[i] = 0.9 * m[i] + 0.1 * gi;
          v[i] = 0.999 * v[i] + 0.001 * gi * gi;
          const double mh = m[i] / (1 - std::pow(0.9, step));
          x[i] -= lr * mh / (std::sqrt(v[i]) / std::sqrt(1 - std::pow(0.999, step)) + 1e-8);
        }
      }
      opt.step(lr);
      size_t idx = 0;
      for (auto& t : p.tensors)
        for (int64_t j = 0; j < t.numel(); ++j) EXPECT_NEAR(t[j].item<double>(), x[idx++], 1e-13) << optim_name(kind);
    }
  }
}

// Float32 tensors of a model's shapes (matrices, vectors, one over a million elements), several steps,
// clipped and not, more than one thread: the fused kernels equal the plain composition to float rounding
// (the two order the same float operations differently: a few units in the last place of each update).
namespace {

void expect_fused_equals_plain(const std::vector<OptimKind>& kinds, const at::Device& device) {
  for (OptimKind kind : kinds)
    for (double clip : {0.0, 0.05}) {
      SCOPED_TRACE(std::string(optim_name(kind)) + " clip " + std::to_string(clip));
      torch::manual_seed(17);
      std::vector<torch::Tensor> a, b;
      for (auto shape : std::vector<std::vector<int64_t>>{{1100, 1024}, {256}, {37, 5}, {1}}) {
        a.push_back((torch::randn(shape).abs() + 1).to(device));  // positive, as are the gradients: no cancellation in g + wd p
        b.push_back(a.back().clone());
      }
      auto named = [](std::vector<torch::Tensor>& t) {
        std::vector<std::pair<std::string, torch::Tensor>> out;
        for (size_t i = 0; i < t.size(); ++i) out.emplace_back("p" + std::to_string(i), t[i]);
        return out;
      };
      OptimizerOptions o{kind, 0.0, clip, kind == OptimKind::kAdagrad ? 0.0 : 0.1, 0.98};
      Optimizer fused(named(a), o);
      o.fused = false;
      Optimizer plain(named(b), o);
      for (int step = 1; step <= 4; ++step) {
        for (size_t i = 0; i < a.size(); ++i) {
          const auto g = torch::randn_like(a[i]).abs() * (i == 0 ? 0.01 : 1e-4);  // tensor 0 clipped when clip > 0
          a[i].mutable_grad() = g.clone();
          b[i].mutable_grad() = g.clone();
        }
        const double lr = 1e-2;
        EXPECT_EQ(fused.runs_fused(), bool(SPANFORMER_HAS_FUSED_OPTIMIZERS));  // else this compares plain with plain
        EXPECT_FALSE(plain.runs_fused());
        fused.step(lr);
        plain.step(lr);
        for (size_t i = 0; i < a.size(); ++i) {
          // A step moves a parameter by up to lr (1e-2). The paths round each update differently (1e-6 of
          // it at most), so each parameter may round to a neighbouring float: one unit in its last place
          // (at most 2^-23 |p|) a step, four after four steps. A different rule (a missing bias correction,
          // clip or decay) moves them 1e-4 or more apart.
          const auto close = (a[i] - b[i]).abs() <= b[i].abs() * (4 * 1.2e-7);
          EXPECT_TRUE(close.all().item<bool>()) << "tensor " << i << " step " << step << ": max difference "
                                                << (a[i] - b[i]).abs().max().item<double>();
        }
      }
    }
}

}  // namespace

TEST(Optim, FusedKernelsEqualThePlainCompositionInFloat) {
  const int threads = at::get_num_threads();
  at::set_num_threads(3);
  expect_fused_equals_plain({OptimKind::kAdagrad, OptimKind::kAdam, OptimKind::kAdamW}, at::kCPU);
  at::set_num_threads(threads);
}

// On CUDA, Adam and AdamW's one-launch kernels (with SPANFORMER_STEP_KERNELS=kernels) to the same bound.
TEST(OptimCuda, FusedKernelsEqualThePlainCompositionOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const spanformer::tu::KernelVariantEnv env("SPANFORMER_STEP_KERNELS", "kernels");
  expect_fused_equals_plain({OptimKind::kAdam, OptimKind::kAdamW}, at::Device(at::kCUDA));
}

// The graphed optimizer step (the lab's CUDA graphs, lab/step_graph.h): the host's share (begin_graph_step: the
// count, the rate written into a device tensor) and the device's (graph_step: the count there, then
// ATen's fused Adam / AdamW reading both tensors) held to step() on CPU parameters, where the same code
// runs eagerly: the same kernels on the same numbers, so the same bits, over steps of changing rates,
// with and without the global clip and weight decay. (On a GPU the replayed graph is held to the eager
// step bit for bit by GraphCuda.ReplayEqualsEagerBitForBit.)
TEST(Optim, GraphedStepEqualsStepOnTheCpu) {
  if (!SPANFORMER_HAS_FUSED_OPTIMIZERS) {  // LibTorch 1.13: the graphed step is refused, by that reason
    std::vector<torch::Tensor> p{torch::randn({3})};
    Optimizer o({{"p", p[0]}}, {OptimKind::kAdamW, 0.0, 0.0, 0.1, 0.98});
    EXPECT_EQ(o.graph_refusal(), "it needs ATen's fused optimizers (LibTorch 2.4 or later)");
    return;
  }
  for (OptimKind kind : {OptimKind::kAdam, OptimKind::kAdamW})
    for (double clip : {0.0, 0.05}) {
      SCOPED_TRACE(std::string(optim_name(kind)) + " clip " + std::to_string(clip));
      torch::manual_seed(19);
      std::vector<torch::Tensor> a, b;
      for (auto shape : std::vector<std::vector<int64_t>>{{300, 64}, {64}, {7, 5}}) {
        a.push_back(torch::randn(shape));
        b.push_back(a.back().clone());
      }
      auto named = [](std::vector<torch::Tensor>& t) {
        std::vector<std::pair<std::string, torch::Tensor>> out;
        for (size_t i = 0; i < t.size(); ++i) out.emplace_back("p" + std::to_string(i), t[i]);
        return out;
      };
      const OptimizerOptions o{kind, 0.0, clip, 0.1, 0.98};
      Optimizer eager(named(a), o), graphed(named(b), o);
      for (int step = 1; step <= 5; ++step) {
        for (size_t i = 0; i < a.size(); ++i) {
          const auto g = torch::randn_like(a[i]) * (i == 0 ? 0.01 : 1e-3);
          a[i].mutable_grad() = g.clone();
          b[i].mutable_grad() = g.clone();
        }
        const double lr = 0.25 * step / 1024.0;  // exact in float32, as the graph's rate tensor holds it
        eager.step(lr);
        graphed.begin_graph_step(lr);
        graphed.graph_step();
        EXPECT_EQ(graphed.steps(), eager.steps());
        for (size_t i = 0; i < a.size(); ++i)
          EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i << " step " << step << ": max difference "
                                                << (a[i] - b[i]).abs().max().item<double>();
      }
    }
}

TEST(Optim, LinearWarmupThenConstant) {
  TrainConfig c;  // the adaptive-span defaults: lr 0.07, warmup 8000, constant
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 0.07 / 8000);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4000), 0.035);
  EXPECT_DOUBLE_EQ(learning_rate(c, 8000), 0.07);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9000), 0.07);
  c.lr_warmup = 0;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 0.07);
}

// Vaswani et al. (2017) eq. 3: d^-0.5 min(k^-0.5, k w^-1.5); with lr = d^-0.5 w^-0.5 (its peak at k = w)
// the two forms agree at every k.
TEST(Optim, InverseSquareRootMatchesThePapersFormula) {
  TrainConfig c;
  c.scheduler = spanformer::Schedule::kInverseSqrt;
  c.lr_warmup = 4000;
  const double d = 512;
  c.lr = 1 / std::sqrt(d) / std::sqrt(4000.0);
  for (int64_t k : {1, 17, 3999, 4000, 4001, 10000, 100000}) {
    const double paper = std::pow(d, -0.5) * std::min(std::pow(k, -0.5), k * std::pow(4000.0, -1.5));
    EXPECT_NEAR(learning_rate(c, k), paper, 1e-15) << k;
  }
}
