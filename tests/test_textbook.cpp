// The textbook's attention modules (ops/masked_softmax.h, attention/scoring.h, attention/multi_head.h,
// nn/attention_pooling.h) against loops written from their formulas, in double precision. The loops
// and the modules sum the same few terms (<= 12) in other orders, so they agree to rounding: 1e-12
// is tight and safe. Gradients are held to central finite differences (step 1e-6: error O(h^2) on
// smooth functions of O(1) inputs, 1e-7 is safe).
#include <gtest/gtest.h>

#include <torch/autograd.h>
#include <torch/nn/init.h>

#include <cmath>
#include <vector>

#include "spanformer/attention/multi_head.h"
#include "spanformer/attention/scoring.h"
#include "spanformer/nn/attention_pooling.h"
#include "spanformer/ops/masked_softmax.h"
#include "spanformer/util/error.h"
#include "util.h"

using namespace spanformer;

namespace {

using tu::max_diff;

// a[b, i, j] by the header's formula, one row at a time; v[b][i] the row's valid length.
torch::Tensor loop_masked_softmax(const torch::Tensor& s, const std::vector<std::vector<int64_t>>& v) {
  auto out = torch::zeros_like(s);
  for (int64_t b = 0; b < s.size(0); ++b)
    for (int64_t i = 0; i < s.size(1); ++i) {
      const int64_t n = v[b][i];
      double denominator = 0;
      for (int64_t j = 0; j < n; ++j) denominator += std::exp(s[b][i][j].item<double>());
      for (int64_t j = 0; j < n; ++j) out[b][i][j] = std::exp(s[b][i][j].item<double>()) / denominator;
    }
  return out;
}

}  // namespace

TEST(MaskedSoftmax, MatchesLoopsPerSequenceAndPerQueryWithEmptyAndFullRows) {
  torch::manual_seed(1);
  auto s = torch::randn({3, 4, 5}, torch::kDouble);
  // Per sequence: lengths 0 (no key: zeros), 5 (every key: the plain softmax) and 2.
  auto per_sequence = torch::tensor({0, 5, 2}, torch::kLong);
  std::vector<std::vector<int64_t>> v1 = {{0, 0, 0, 0}, {5, 5, 5, 5}, {2, 2, 2, 2}};
  auto a = ops::masked_softmax(s, per_sequence);
  EXPECT_LT(max_diff(a, loop_masked_softmax(s, v1)), 1e-12);
  EXPECT_EQ(a[0].abs().sum().item<double>(), 0.0);
  EXPECT_LT(max_diff(a[1], torch::softmax(s[1], -1)), 1e-15);
  // Per query.
  auto per_query = torch::tensor({{1, 0, 3, 5}, {5, 4, 0, 2}, {2, 2, 1, 1}}, torch::kLong);
  std::vector<std::vector<int64_t>> v2 = {{1, 0, 3, 5}, {5, 4, 0, 2}, {2, 2, 1, 1}};
  EXPECT_LT(max_diff(ops::masked_softmax(s, per_query), loop_masked_softmax(s, v2)), 1e-12);
  // Heads share the lengths: (B, K, N, C).
  auto s4 = torch::randn({3, 2, 4, 5}, torch::kDouble);
  auto a4 = ops::masked_softmax(s4, per_query);
  for (int64_t h = 0; h < 2; ++h)
    EXPECT_LT(max_diff(a4.select(1, h), loop_masked_softmax(s4.select(1, h).contiguous(), v2)), 1e-12);
  // Float32 with huge scores: finite, and rows still sum to 1.
  auto big = (torch::randn({3, 4, 5}) * 1e30).to(torch::kFloat);
  auto ab = ops::masked_softmax(big, per_query);
  EXPECT_TRUE(torch::isfinite(ab).all().item<bool>());
}

TEST(MaskedSoftmax, GradientIsFiniteAndZeroOnEmptyRows) {
  auto s = torch::randn({2, 3, 4}, torch::kDouble).requires_grad_(true);
  auto valid = torch::tensor({{0, 2, 4}, {1, 0, 3}}, torch::kLong);
  auto w = torch::randn({2, 3, 4}, torch::kDouble);
  auto g = torch::autograd::grad({(ops::masked_softmax(s, valid) * w).sum()}, {s})[0];
  EXPECT_TRUE(torch::isfinite(g).all().item<bool>());
  EXPECT_EQ(g[0][0].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(g[1][1].abs().sum().item<double>(), 0.0);
  // Masked keys of a non-empty row get no gradient either.
  EXPECT_EQ(g[0][1].narrow(0, 2, 2).abs().sum().item<double>(), 0.0);
  // Central differences on the kept ones.
  const double h = 1e-6;
  auto sd = s.detach();
  for (int64_t j = 0; j < 2; ++j) {
    auto plus = sd.clone(), minus = sd.clone();
    plus[0][1][j] += h;
    minus[0][1][j] -= h;
    const double fd = ((ops::masked_softmax(plus, valid) * w).sum().item<double>() -
                       (ops::masked_softmax(minus, valid) * w).sum().item<double>()) / (2 * h);
    EXPECT_NEAR(g[0][1][j].item<double>(), fd, 1e-7);
  }
}

TEST(MaskedSoftmax, RefusesBadLengths) {
  auto s = torch::randn({2, 3, 4});
  EXPECT_ERROR_WITH(ops::masked_softmax(s, torch::tensor({1, 5}, torch::kLong)), "valid lengths must lie in [0, 4] (got 1 .. 5)");   // > C
  EXPECT_ERROR_WITH(ops::masked_softmax(s, torch::tensor({-1, 2}, torch::kLong)), "valid lengths must lie in [0, 4] (got -1 .. 2)");  // < 0
  EXPECT_ERROR_WITH(ops::masked_softmax(s, torch::tensor({1.0, 2.0})), "valid lengths must be integers");              // not integers
  EXPECT_ERROR_WITH(ops::masked_softmax(s, torch::tensor({1, 2, 3}, torch::kLong)), "valid lengths must be (B) = (2) or (B, N) = (2, 3) (got 3)");  // not (B)
  EXPECT_ERROR_WITH(ops::masked_softmax(torch::randn({4, 5}), torch::tensor({1}, torch::kLong)), "scores must be (B, N, C) or (B, K, N, C) (got 2 dims)");
}

TEST(AttentionScoring, EveryScoreMatchesItsFormula) {
  torch::manual_seed(2);
  const int64_t B = 2, N = 3, C = 4, Dq = 5, Dk = 5, Dv = 3, h = 6;
  auto q = torch::randn({B, N, Dq}, torch::kDouble), k = torch::randn({B, C, Dk}, torch::kDouble);
  auto v = torch::randn({B, C, Dv}, torch::kDouble);
  auto valid = torch::tensor({2, 4}, torch::kLong);
  for (auto kind : {attention::ScoreKind::kAdditive, attention::ScoreKind::kDot, attention::ScoreKind::kScaledDot,
                    attention::ScoreKind::kGeneral}) {
    SCOPED_TRACE(attention::score_kind_name(kind));
    attention::AttentionScoring scoring(attention::ScoringOptions{kind, Dq, Dk, h, 0.0});
    scoring->to(torch::kDouble);
    auto [out, a] = scoring->forward(q, k, v, valid);
    auto s = torch::zeros({B, N, C}, torch::kDouble);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < C; ++j) {
          double value = 0;
          if (kind == attention::ScoreKind::kAdditive) {
            auto Wq = scoring->named_parameters()["w_q.weight"], Wk = scoring->named_parameters()["w_k.weight"];
            auto wv = scoring->named_parameters()["w_v.weight"][0];
            for (int64_t r = 0; r < h; ++r) {
              double x = 0;
              for (int64_t d = 0; d < Dq; ++d) x += Wq[r][d].item<double>() * q[b][i][d].item<double>();
              for (int64_t d = 0; d < Dk; ++d) x += Wk[r][d].item<double>() * k[b][j][d].item<double>();
              value += wv[r].item<double>() * std::tanh(x);
            }
          } else if (kind == attention::ScoreKind::kGeneral) {
            auto W = scoring->named_parameters()["w"];
            for (int64_t d = 0; d < Dq; ++d)
              for (int64_t e = 0; e < Dk; ++e)
                value += q[b][i][d].item<double>() * W[d][e].item<double>() * k[b][j][e].item<double>();
          } else {
            for (int64_t d = 0; d < Dq; ++d) value += q[b][i][d].item<double>() * k[b][j][d].item<double>();
            if (kind == attention::ScoreKind::kScaledDot) value /= std::sqrt(static_cast<double>(Dk));
          }
          s[b][i][j] = value;
        }
    auto expected_a = loop_masked_softmax(s, {{2, 2, 2}, {4, 4, 4}});
    EXPECT_LT(max_diff(a, expected_a), 1e-12);
    auto expected_out = torch::zeros({B, N, Dv}, torch::kDouble);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < C; ++j) expected_out[b][i] += expected_a[b][i][j] * v[b][j];
    EXPECT_LT(max_diff(out, expected_out), 1e-12);
  }
  EXPECT_ERROR_WITH(attention::AttentionScoring(attention::ScoringOptions{attention::ScoreKind::kDot, 4, 5}), "the dot score needs queries and keys of one width (got 4 and 5)");
  EXPECT_ERROR_WITH(attention::parse_score_kind("cosine"), "score must be additive, dot, scaled_dot or general (got 'cosine')");
}

// Multi-head attention: loops over heads, queries and keys from the header's formula, with the
// projections' weights read back; valid lengths, key padding and the causal rule with a cache (N < C).
TEST(MultiHeadAttention, MatchesLoopsWithEveryMaskAndCrossWidths) {
  torch::manual_seed(3);
  const int64_t B = 2, N = 3, C = 5, H = 8, K = 2, D = H / K, Hkv = 6;
  attention::MultiHeadAttention mha(attention::MultiHeadOptions{H, K, Hkv, 0.0, true});
  mha->to(torch::kDouble);
  auto x = torch::randn({B, N, H}, torch::kDouble), m = torch::randn({B, C, Hkv}, torch::kDouble);
  attention::AttentionMask mask;
  mask.valid = torch::tensor({4, 5}, torch::kLong);
  mask.key_padding = torch::zeros({B, C}, torch::kBool);
  mask.key_padding[1][0] = true;
  mask.causal = true;
  torch::Tensor weights;
  auto out = mha->forward(x, m, mask, &weights);
  auto q = mha->w_q(x), k = mha->w_k(m), v = mha->w_v(m);  // (B, N, H), (B, C, H), (B, C, H)
  auto concat = torch::zeros({B, N, H}, torch::kDouble);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hd = 0; hd < K; ++hd)
      for (int64_t i = 0; i < N; ++i) {
        std::vector<double> e(C, 0.0);
        double z = 0;
        for (int64_t j = 0; j < C; ++j) {
          const bool keep = j < mask.valid[b].item<int64_t>() && !mask.key_padding[b][j].item<bool>() && j <= C - N + i;
          if (!keep) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q[b][i][hd * D + d].item<double>() * k[b][j][hd * D + d].item<double>();
          e[j] = std::exp(s / std::sqrt(static_cast<double>(D)));
          z += e[j];
        }
        for (int64_t j = 0; j < C; ++j) {
          const double a = z > 0 ? e[j] / z : 0.0;
          EXPECT_NEAR(weights[b][hd][i][j].item<double>(), a, 1e-12);
          concat[b][i].narrow(0, hd * D, D) += a * v[b][j].narrow(0, hd * D, D);
        }
      }
  EXPECT_LT(max_diff(out, mha->w_o(concat)), 1e-12);
  // Self-attention without masks is the plain softmax; bad shapes are one-line errors.
  attention::MultiHeadAttention self(attention::MultiHeadOptions{H, K});
  EXPECT_EQ(self->forward(torch::randn({B, N, H}), torch::randn({B, N, H})).sizes(), (torch::IntArrayRef{B, N, H}));
  EXPECT_ERROR_WITH(self->forward(torch::randn({B, N, H + 1}), torch::randn({B, N, H})), "queries must be (B, N, 8)");
  EXPECT_ERROR_WITH(attention::MultiHeadAttention(attention::MultiHeadOptions{H, 3}), "d_model (8) must be a positive multiple of heads (3)");
  attention::AttentionMask bad;
  bad.key_padding = torch::zeros({B, C + 1}, torch::kBool);
  EXPECT_ERROR_WITH(self->forward(torch::randn({B, N, H}), torch::randn({B, C, H}), bad), "key_padding must be a bool (B, C) = (2, 5) mask");
}

TEST(AttentionPooling, ClosedFormsAndLimits) {
  auto x = torch::linspace(0, 5, 11, torch::kDouble), y = 2 * torch::sin(x) + x.pow(0.8);
  auto queries = torch::tensor({0.3, 2.5, 4.9}, torch::kDouble);
  auto w = torch::ones({1}, torch::kDouble);
  // Average: the mean, whatever the query.
  auto avg = torch::mv(nn::pooling_weights(nn::Pooling::kAverage, queries, x, w), y);
  EXPECT_LT(max_diff(avg, y.mean().expand({3})), 1e-14);
  // Nadaraya-Watson by its formula.
  auto a = nn::pooling_weights(nn::Pooling::kNadaraya, queries, x, w);
  for (int64_t i = 0; i < 3; ++i) {
    double z = 0, f = 0;
    for (int64_t j = 0; j < 11; ++j) z += std::exp(-std::pow(queries[i].item<double>() - x[j].item<double>(), 2) / 2);
    for (int64_t j = 0; j < 11; ++j)
      f += std::exp(-std::pow(queries[i].item<double>() - x[j].item<double>(), 2) / 2) / z * y[j].item<double>();
    EXPECT_NEAR(torch::mv(a, y)[i].item<double>(), f, 1e-12);
  }
  // Rows sum to 1; a constant is reproduced; a narrow kernel interpolates, a wide one averages.
  EXPECT_LT(max_diff(a.sum(1), torch::ones({3}, torch::kDouble)), 1e-14);
  EXPECT_LT(max_diff(torch::mv(a, torch::full({11}, 3.0, torch::kDouble)), torch::full({3}, 3.0, torch::kDouble)), 1e-14);
  auto at_keys = torch::mv(nn::pooling_weights(nn::Pooling::kNadaraya, x, x, torch::full({1}, 100.0, torch::kDouble)), y);
  EXPECT_LT(max_diff(at_keys, y), 1e-12);
  auto wide = torch::mv(nn::pooling_weights(nn::Pooling::kNadaraya, queries, x, torch::full({1}, 1e-6, torch::kDouble)), y);
  EXPECT_LT(max_diff(wide, y.mean().expand({3})), 1e-9);
  EXPECT_ERROR_WITH(nn::pooling_weights(nn::Pooling::kNadaraya, x.view({11, 1}), x, w), "queries must be (Q) (got 11x1)");
}

TEST(AttentionPooling, ParametricGradientAndLeaveOneOutFit) {
  torch::manual_seed(4);
  auto x = std::get<0>(torch::sort(torch::rand({40}, torch::kDouble) * 5));
  auto y = 2 * torch::sin(x) + x.pow(0.8) + 0.5 * torch::randn({40}, torch::kDouble);
  nn::ParametricPooling pooling(1.0);
  auto queries = torch::tensor({1.0, 3.0}, torch::kDouble);
  auto loss = [&](double w) {
    torch::NoGradGuard no_grad;
    pooling->w.fill_(w);
    return pooling->forward(queries, x, y).pow(2).sum().item<double>();
  };
  pooling->w.detach().fill_(1.3);
  auto g = torch::autograd::grad({pooling->forward(queries, x, y).pow(2).sum()}, {pooling->w})[0].item<double>();
  const double h = 1e-6, fd = (loss(1.3 + h) - loss(1.3 - h)) / (2 * h);
  EXPECT_NEAR(g, fd, 1e-7 * std::max(1.0, std::abs(fd)));
  pooling->w.detach().fill_(1.0);
  auto losses = nn::fit_parametric_pooling(*pooling, x, y, 20, 0.5);
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_LT(losses.back(), losses.front());  // leave-one-out error falls as w sharpens the kernel
}
