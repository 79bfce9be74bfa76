// The attention layer against a direct double loop over (batch, head, query, distance): relative
// positions, cache padding, span masks, persistent memory; plus finite-difference gradients.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>

#include "spanformer/attention/attn_impl.h"
#include "spanformer/attention/seq_attention.h"
#include "spanformer/ops/skew.h"
#include "util.h"

using namespace spanformer::attention;
namespace ops = spanformer::ops;

namespace {

// out (B, M, H) computed with loops from the layer's own weights: the executable spec.
torch::Tensor direct_attention(SeqAttention& a, const torch::Tensor& h, const torch::Tensor& cache,
                               const torch::Tensor& key_pe) {
  const auto& o = a->options();
  const int64_t B = h.size(0), M = h.size(1), H = o.hidden_size(), K = o.nb_heads(), D = H / K;
  const int64_t L = o.attn_span(), Lp = a->used_span(), C = cache.size(1), N = o.pers_mem_size();
  // Context = cache (zero-padded on the left to Lp) ++ h.
  auto ctx = torch::zeros({B, Lp + M, H}, torch::kDouble);
  for (int64_t t = 0; t < std::min(C, Lp); ++t) ctx.select(1, Lp - 1 - t).copy_(cache.select(1, C - 1 - t));
  ctx.narrow(1, Lp, M).copy_(h);
  auto q = a->proj_query(h), k = a->proj_key(ctx), v = a->proj_val(ctx);
  auto qa = q.accessor<double, 3>(), ka = k.accessor<double, 3>(), va = v.accessor<double, 3>();
  auto pe = key_pe.accessor<double, 2>();
  auto out = torch::zeros({B, M, H}, torch::kDouble);
  auto oa = out.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hd = 0; hd < K; ++hd) {
      const double z = a->span ? a->span->span_ratio[hd].item<double>() * L : 0;
      // The reference: the softmax runs over the whole window (both paths must give this).
      for (int64_t i = 0; i < M; ++i) {
        std::vector<double> s(Lp + N, -INFINITY);
        for (int64_t d = 1; d <= Lp; ++d) {  // key at context index Lp + i - d
          double dot = 0;
          for (int64_t e = 0; e < D; ++e)
            dot += qa[b][i][hd * D + e] * (ka[b][Lp + i - d][hd * D + e] + pe[e][L - d]);
          s[d - 1] = dot / std::sqrt(double(D));
        }
        for (int64_t n = 0; n < N; ++n) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qa[b][i][hd * D + e] * a->pers_key[hd][e][n].item<double>();
          s[Lp + n] = dot;  // (q . key * sqrt(D)) / sqrt(D)
        }
        double mx = -1e300, sum = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double& x : s) sum += (x = std::exp(x - mx));
        double total = 0;
        for (int64_t j = 0; j < Lp + N; ++j) {
          s[j] /= sum;
          if (j < Lp && a->span) s[j] *= spanformer::nn::span_mask_value(z, j + 1, o.adapt_span_ramp());
          total += s[j];
        }
        if (a->span) for (double& x : s) x /= total + 1e-8;
        for (int64_t e = 0; e < D; ++e) {
          double acc = 0;
          for (int64_t d = 1; d <= Lp; ++d) acc += s[d - 1] * va[b][Lp + i - d][hd * D + e];
          for (int64_t n = 0; n < N; ++n) acc += s[Lp + n] * a->pers_val[hd][n][e].item<double>() * std::sqrt(double(N));
          oa[b][i][hd * D + e] = acc;
        }
      }
    }
  return a->proj_out(out);
}

struct Case {
  int64_t B, M, K, D, L, cache, pers;
  std::vector<double> ratios;  // per head
  bool fused = false;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << " M" << c.M << " K" << c.K << " D" << c.D << " L" << c.L << " cache" << c.cache << " pers" << c.pers
      << (c.fused ? " fused" : " plain");
}

SeqAttention make_layer(const Case& c) {
  SeqAttention a(SeqAttentionOptions(c.K * c.D, c.K, c.L).adapt_span_ramp(4).pers_mem_size(c.pers).impl(c.fused ? AttnImpl::kFused : AttnImpl::kPlain));
  a->to(torch::kDouble);
  a->eval();
  torch::NoGradGuard g;
  for (int64_t k = 0; k < c.K; ++k) a->span->span_ratio[k] = c.ratios[k];
  a->span->sync_host();
  return a;
}

}  // namespace

class AttentionVsLoop : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionVsLoop, MatchesDirectDoubleLoop) {
  Case c = GetParam();
  for (bool fused : {false, true}) {
    c.fused = fused;
    torch::manual_seed(7);
    auto a = make_layer(c);
    auto h = torch::randn({c.B, c.M, c.K * c.D}, torch::kDouble);
    auto cache = torch::randn({c.B, c.cache, c.K * c.D}, torch::kDouble);
    auto key_pe = torch::randn({c.D, c.L}, torch::kDouble);
    torch::NoGradGuard g;
    auto got = a->forward(h, cache, key_pe);
    auto want = direct_attention(a, h, cache, key_pe);
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-10) << (fused ? "fused" : "plain");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionVsLoop,
                         ::testing::Values(Case{2, 5, 2, 4, 8, 8, 0, {0.0, 1.0}},         // spans 0 and L
                                           Case{1, 7, 3, 3, 20, 20, 0, {0.1, 0.45, 0.8}},  // mixed spans
                                           Case{2, 6, 2, 4, 70, 10, 0, {0.9, 0.3}},        // cache shorter than span
                                           Case{1, 9, 2, 4, 200, 200, 0, {0.05, 0.1}},     // trimmed to the last 64+
                                           Case{2, 4, 2, 4, 12, 12, 3, {0.2, 0.6}}),       // persistent memory
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return "B" + std::to_string(c.B) + "_M" + std::to_string(c.M) + "_K" + std::to_string(c.K) +
                                  "_L" + std::to_string(c.L) + "_cache" + std::to_string(c.cache) + "_pers" +
                                  std::to_string(c.pers);
                         });

TEST(Attention, SkewIsTheInverseOfUnskew) {
  auto x = torch::randn({2, 3, 5, 7}, torch::kDouble);   // (.., M=5, W=7)
  auto skewed = ops::skew(x);                                // (.., 5, 12)
  EXPECT_TRUE(torch::equal(ops::unskew(skewed), x));
  // Row i of the skewed matrix holds x[i] at columns i .. i+W-1 and zeros elsewhere.
  EXPECT_TRUE(torch::equal(skewed[0][0][2].narrow(0, 2, 7), x[0][0][2]));
  EXPECT_EQ(skewed[0][0][2].narrow(0, 0, 2).abs().sum().item<double>(), 0.0);
}

TEST(Attention, TrimmingDoesNotChangeOutputs) {
  torch::manual_seed(3);
  Case c{2, 16, 2, 8, 512, 512, 0, {0.05, 0.08}};
  auto a = make_layer(c);
  auto h = torch::randn({2, 16, 16}, torch::kDouble);
  auto cache = torch::randn({2, 512, 16}, torch::kDouble);
  auto key_pe = torch::randn({8, 512}, torch::kDouble);
  torch::NoGradGuard g;
  ASSERT_LT(a->used_span(), 512);
  auto trimmed = a->forward(h, cache, key_pe);
  a->span->set_host_ratios(std::vector<double>(2, 1.0));  // pretend a head spans L: no trimming
  ASSERT_EQ(a->used_span(), 512);
  auto full = a->forward(h, cache, key_pe);
  // Masked keys contribute exact zeros; only the 1e-8 in the renormalisation sees the softmax's
  // different denominator, a relative change below 1e-8.
  EXPECT_LT((trimmed - full).abs().max().item<double>(), 1e-7);
}

TEST(Attention, FiniteDifferenceGradients) {
  torch::manual_seed(11);
  Case c{1, 4, 2, 3, 10, 6, 2, {0.33, 0.71}};  // z = 3.3, 7.1: no kink of the mask at an integer distance
  auto a = make_layer(c);
  a->train();  // dropout is 0: deterministic
  auto h = torch::randn({1, 4, 6}, torch::dtype(torch::kDouble).requires_grad(true));
  auto cache = torch::randn({1, 6, 6}, torch::kDouble);
  auto key_pe = torch::randn({3, 10}, torch::dtype(torch::kDouble).requires_grad(true));
  auto weights = torch::randn({1, 4, 6}, torch::kDouble);
  auto f = [&] { return (a->forward(h, cache, key_pe) * weights).sum(); };
  spanformer::tu::expect_finite_differences(f, {h, key_pe, a->span->span_ratio, a->proj_query->weight, a->proj_key->weight,
                                                a->proj_val->weight, a->pers_key, a->pers_val});
}

// The GPT flash attention's auto rule beyond SDPA (attention dropout in training): the CUDA kernels'
// version 1 exactly where it runs and was measured (bf16 / fp16, D 32 / 64 / 128, no KV cache), the ATen
// tiles elsewhere (include/spanformer/attention/attn_impl.h).
TEST(Attention, FlashAutoRuleTakesTheKernelsWhereVersion1Runs) {
  using spanformer::attention::auto_rule::flash_kernels;
  EXPECT_TRUE(flash_kernels(true, true, 64, 1024, 1024));
  EXPECT_TRUE(flash_kernels(true, true, 32, 7, 7));
  EXPECT_TRUE(flash_kernels(true, true, 128, 1024, 1024));
  EXPECT_FALSE(flash_kernels(false, true, 64, 1024, 1024)) << "the CPU: the ATen tiles";
  EXPECT_FALSE(flash_kernels(true, false, 64, 1024, 1024)) << "fp32: version 0, slower than the tiles";
  EXPECT_FALSE(flash_kernels(true, true, 96, 1024, 1024)) << "D 96: version 0";
  EXPECT_FALSE(flash_kernels(true, true, 64, 1, 1024)) << "a KV cache: not measured";
}
