// The span module against its formulas (paper eq. 6 and the reference's trimming rules), in double.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "spanformer/nn/adaptive_span.h"

using spanformer::nn::AdaptiveSpan;
using spanformer::nn::AdaptiveSpanOptions;

TEST(AdaptiveSpan, MaskMatchesFormula) {
  const int64_t L = 300, R = 32;
  AdaptiveSpan span(AdaptiveSpanOptions(L, 4).ramp(R));
  span->to(torch::kDouble);
  const double ratios[4] = {0.0, 0.1, 0.5337, 1.0};
  {
    torch::NoGradGuard g;
    for (int k = 0; k < 4; ++k) span->span_ratio[k] = ratios[k];
  }
  for (int64_t width : {int64_t{1}, int64_t{64}, int64_t{150}, L}) {
    auto m = span->mask(width);  // (K, 1, W)
    ASSERT_EQ(m.sizes(), (std::vector<int64_t>{4, 1, width}));
    for (int k = 0; k < 4; ++k) {
      for (int64_t j = 0; j < width; ++j) {
        const int64_t d = width - j;  // column j = distance W - j
        EXPECT_NEAR(m[k][0][j].item<double>(), spanformer::nn::span_mask_value(ratios[k] * L, d, R), 1e-12)
            << "head " << k << " distance " << d;
      }
    }
  }
  // Sanity of the formula itself: 1 inside the span, 0 beyond span + ramp, linear in between.
  EXPECT_EQ(spanformer::nn::span_mask_value(10, 1, 32), 1.0);
  EXPECT_EQ(spanformer::nn::span_mask_value(10, 11, 32), 1.0);
  EXPECT_DOUBLE_EQ(spanformer::nn::span_mask_value(10, 27, 32), 0.5);
  EXPECT_EQ(spanformer::nn::span_mask_value(10, 43, 32), 0.0);
}

TEST(AdaptiveSpan, ForwardMasksAndRenormalises) {
  AdaptiveSpan span(AdaptiveSpanOptions(16, 2).ramp(4).init(0.25));
  span->to(torch::kDouble);
  torch::manual_seed(0);
  auto attn = torch::softmax(torch::randn({3, 2, 5, 16}, torch::kDouble), -1);
  auto out = span(attn);
  auto masked = attn * span->mask(16);
  auto in_span = masked.sum(-1);                                      // N per row
  EXPECT_TRUE(torch::allclose(out, masked / (in_span.unsqueeze(-1) + 1e-8), 0, 1e-15));
  // Rows sum to N / (N + 1e-8): one, up to the 1e-8.
  EXPECT_TRUE(torch::allclose(out.sum(-1), in_span / (in_span + 1e-8), 0, 1e-14));
}

TEST(AdaptiveSpan, TrimAndCacheSizesFollowTheLargestSpan) {
  const int64_t L = 1024, R = 32;
  for (double ratio : {0.0, 0.01, 0.0390625, 0.2, 0.5, 0.93, 0.97, 1.0}) {
    AdaptiveSpan span(AdaptiveSpanOptions(L, 3).ramp(R));
    {
      torch::NoGradGuard g;
      span->span_ratio.copy_(torch::tensor({ratio / 2, ratio, 0.0}));
    }
    span->sync_host();
    // Reference rule, written out: S = min(L, ceil(max z) + R); trim = 64 * floor(min(L-1, L-S) / 64).
    const int64_t S = std::min<int64_t>(L, static_cast<int64_t>(std::ceil(static_cast<float>(ratio) * double(L))) + R);
    const int64_t trim = std::min(L - 1, L - S) / 64 * 64;
    EXPECT_EQ(span->max_size(), S) << ratio;
    EXPECT_EQ(span->trim_len(), trim) << ratio;
    EXPECT_EQ(span->used_span(), L - trim) << ratio;
    EXPECT_EQ(span->cache_size(), std::min(L, L - trim + 64)) << ratio;
    EXPECT_GE(span->used_span(), S) << "the used keys must cover every head's span + ramp";
  }
  AdaptiveSpan no_cache(AdaptiveSpanOptions(L, 2).adapt_cache(false));
  EXPECT_EQ(no_cache->cache_size(), L);
}

TEST(AdaptiveSpan, LossAndClamp) {
  AdaptiveSpan span(AdaptiveSpanOptions(512, 4).loss_coeff(2e-6));
  {
    torch::NoGradGuard g;
    span->span_ratio.copy_(torch::tensor({-0.5f, 0.25f, 0.75f, 1.5f}));
  }
  EXPECT_NEAR(span->loss().item<double>(), 2e-6 * 512 * (-0.5 + 0.25 + 0.75 + 1.5) / 4, 1e-10);  // float32 parameter: ~1e-7 relative
  span->clamp_();
  auto r = span->span_ratio;
  EXPECT_FLOAT_EQ(r[0].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(r[1].item<float>(), 0.25f);
  EXPECT_FLOAT_EQ(r[3].item<float>(), 1.0f);
}
