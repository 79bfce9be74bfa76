// The hash dropout every model drops with (include/spanformer/nn/dropout.h), held to its plain
// double-precision loop, to the statistics a Bernoulli mask must have, and to its own gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "spanformer/nn/dropout.h"
#include "util.h"

namespace sn = spanformer::nn;

namespace {

// n elements kept with probability q: the count is within 6 standard deviations of n q (a false
// failure has probability about 2e-9 per check).
void expect_binomial(int64_t kept, int64_t n, double q, const char* what) {
  const double sd = std::sqrt(n * q * (1 - q));
  EXPECT_NEAR(static_cast<double>(kept), n * q, 6 * sd) << what;
}

}  // namespace

// Every dtype, sizes around the 4096-element chunks, a non-contiguous input: equal to the reference loop
// (to the roundings each takes: see below).
TEST(HashDropout, EqualsItsReferenceLoopInEveryDtype) {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat64, torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (int64_t n : {1, 4095, 4096, 4097, 3 * 4096 + 5, 70000}) {
      for (double p : {0.1, 0.5, 0.9}) {
        const auto x = torch::randn({n}, torch::kFloat64).to(dtype);
        const uint64_t seed = 1234567 + n;
        const auto y = sn::dropout_with_seed(x, p, seed), r = sn::dropout_reference(x, p, seed);
        ASSERT_EQ(y.scalar_type(), dtype);
        // A kept element is x times 1/(1-p), both in the arithmetic type (float for 16-bit and float
        // tensors, double for double), rounded once to the dtype: exactly what ATen's x.float() * (1 / (1 - p))
        // gives, so equal bit for bit (a scale off by one unit of its last place shows in many elements).
        const auto op = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
        const auto kept = (x.to(op) * (1.0 / (1.0 - p))).to(dtype);
        EXPECT_TRUE(torch::equal(y, torch::where(r == 0, torch::zeros_like(x), kept))) << "n " << n << " p " << p << " " << dtype;
        EXPECT_TRUE(torch::equal(y == 0, r == 0)) << "n " << n << " p " << p;  // the same elements dropped
      }
    }
  }
  // A transposed view is dropped as its contiguous copy is.
  const auto x = torch::randn({300, 70}).t();  // (70, 300), not contiguous
  EXPECT_TRUE(torch::allclose(sn::dropout_with_seed(x, 0.3, 9), sn::dropout_reference(x.contiguous(), 0.3, 9), 1.2e-7, 0));
}

// The kept fraction is 1 - p, kept values are x / (1 - p) (so the mean is unbiased), neighbouring
// elements, rows, columns and consecutive seeds are independent.
TEST(HashDropout, KeepsOneMinusPIndependentlyAndUnbiased) {
  const int64_t R = 1000, C = 1000, n = R * C;
  for (double p : {0.1, 0.5}) {
    const auto ones = torch::ones({R, C});
    const auto y = sn::dropout_with_seed(ones, p, 77);  // (R, C)
    const auto kept = y != 0;
    expect_binomial(kept.sum().item<int64_t>(), n, 1 - p, "kept fraction");
    EXPECT_TRUE(torch::allclose(y.masked_select(kept), torch::full({1}, 1.0 / (1 - p)))) << "kept scale";
    // Each row and each column on its own: the extremes over 1000 rows stay within 6 sd of C (1 - p).
    const double sd = std::sqrt(C * p * (1 - p));
    for (int dim : {0, 1}) {
      const auto counts = kept.sum(dim).to(torch::kFloat64);  // (1000)
      EXPECT_LT((counts - C * (1 - p)).abs().max().item<double>(), 6 * sd) << "dim " << dim << " p " << p;
    }
    // Neighbours: both kept with probability (1 - p)^2.
    const auto flat = kept.view(-1);
    const auto both = (flat.slice(0, 0, n - 1) & flat.slice(0, 1, n)).sum().item<int64_t>();
    expect_binomial(both, n - 1, (1 - p) * (1 - p), "neighbours");
    // Seeds 77 and 78: the same element kept by both with probability (1 - p)^2.
    const auto other = sn::dropout_with_seed(ones, p, 78) != 0;
    expect_binomial((kept & other).sum().item<int64_t>(), n, (1 - p) * (1 - p), "consecutive seeds");
    // Unbiased: the mean of dropout(x) is the mean of x within 6 sd of the mask's noise.
    const auto x = torch::rand({n}, torch::kFloat64) + 0.5;
    const auto mean_y = sn::dropout_with_seed(x, p, 5).mean().item<double>();
    const double noise = x.pow(2).mean().item<double>() * p / (1 - p) / n;  // variance of the mean
    EXPECT_NEAR(mean_y, x.mean().item<double>(), 6 * std::sqrt(noise)) << "p " << p;
  }
}

// One draw from the default generator per call: manual_seed repeats a call's mask, successive calls
// differ, and the mask does not depend on the number of threads.
TEST(HashDropout, SeededByTheGeneratorAndIndependentOfThreads) {
  const auto x = torch::randn({64, 4096});
  torch::manual_seed(11);
  const auto a = sn::dropout(x, 0.2, true), b = sn::dropout(x, 0.2, true);
  torch::manual_seed(11);
  EXPECT_TRUE(torch::equal(sn::dropout(x, 0.2, true), a));
  EXPECT_FALSE(torch::equal(a, b));
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = sn::dropout_with_seed(x, 0.2, 21);
  at::set_num_threads(3);
  const auto three = sn::dropout_with_seed(x, 0.2, 21);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, three));
  EXPECT_TRUE(torch::equal(sn::dropout_with_seed(x, 0.2, 21), one));
  // Not training or p = 0: the input itself; p = 1: zeros.
  EXPECT_TRUE(sn::dropout(x, 0.2, false).is_same(x));
  EXPECT_TRUE(sn::dropout(x, 0.0, true).is_same(x));
  EXPECT_EQ(sn::dropout(x, 1.0, true).abs().sum().item<float>(), 0.0f);
  // Out-of-range probabilities: one-line errors.
  EXPECT_EQ(spanformer::tu::error_of([&] { sn::dropout(x, 1.5, true); }), "dropout: probability must be in [0, 1] (got 1.5)");
  EXPECT_EQ(spanformer::tu::error_of([&] { sn::dropout(x, -0.1, true); }), "dropout: probability must be in [0, 1] (got -0.1)");
  EXPECT_EQ(spanformer::tu::error_of([&] { sn::dropout(x, std::nan(""), true); }), "dropout: probability must be in [0, 1] (got nan)");
}

// The gradient is the same mask on the upstream gradient; double backward through it too; the module
// drops in training and passes through in eval.
TEST(HashDropout, GradientIsTheSameMask) {
  const auto x = torch::randn({37, 129}, torch::kFloat64).requires_grad_();
  const auto g = torch::randn({37, 129}, torch::kFloat64);
  const auto y = sn::dropout_with_seed(x, 0.3, 99);
  const auto dx = torch::autograd::grad({y}, {x}, {g}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_TRUE(torch::allclose(dx, sn::dropout_reference(g, 0.3, 99), 2.3e-16, 0));
  EXPECT_TRUE(torch::equal(dx == 0, y == 0));
  // d/dg <dx, h> = dropout(h): the backward is itself differentiable.
  const auto h = torch::randn({37, 129}, torch::kFloat64);
  const auto gg = g.clone().requires_grad_();
  const auto dx2 = torch::autograd::grad({y}, {x}, {gg}, true, true)[0];
  const auto dgg = torch::autograd::grad({(dx2 * h).sum()}, {gg})[0];
  EXPECT_TRUE(torch::allclose(dgg, sn::dropout_reference(h, 0.3, 99), 2.3e-16, 0));
  // The module.
  sn::Dropout drop(0.25);
  const auto z = torch::ones({100000});
  const auto kept = (drop(z) != 0).sum().item<int64_t>();
  expect_binomial(kept, 100000, 0.75, "module kept fraction");
  drop->eval();
  EXPECT_TRUE(drop(z).is_same(z));
}
