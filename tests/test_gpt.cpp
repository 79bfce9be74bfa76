// The GPT family: each causal attention against an independent loop oracle in double
// precision (and the weights attention pictures record, attention/record.h), the fused tiles against
// the plain composition (values and every gradient, spans
// included), causality, KV-cache generation against recomputation, the sliding-window evaluation
// against a direct computation, AdamW's update, and training on the engine (resume bit for bit).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <fstream>

#include "spanformer/attention/causal_attention.h"
#include "spanformer/attention/record.h"
#include "spanformer/config/gpt_config.h"
#include "spanformer/models/gpt.h"
#include "spanformer/nn/positional.h"
#include "spanformer/nn/adaptive_span.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/eval_checkpoint.h"
#include "spanformer/train/family.h"
#include "spanformer/train/optim.h"
#include "gpt_util.h"
#include "ops/cpu/matvec.h"
#include "ops/cpu_features.h"
#include "util.h"

using namespace spanformer;
using attention::AttnImpl;
using attention::CausalKind;
using tu::tiny_gpt;

namespace {

struct Case {
  CausalKind kind;
  int64_t window;
  std::vector<double> z;  // adaptive span: per head z (tokens)
  int64_t L;              // adaptive span: largest span
  int64_t stride = 0, summary = 0, layer = 0;  // sparse patterns
  attention::SparseCombine combine = attention::SparseCombine::kMerged;
};

// The Sparse Transformer's pattern for head h of K, written from the paper's definitions.
bool sparse_allowed(const Case& c, int64_t h, int64_t K, int64_t i, int64_t j) {
  if (j > i) return false;
  if (j == i) return true;
  const int64_t l = c.stride;
  const bool a1 = c.kind == CausalKind::kSparseStrided ? i - j < l : i / l == j / l;
  const bool a2 = c.kind == CausalKind::kSparseStrided ? (i - j) % l == 0 : j % l >= l - c.summary;
  switch (c.combine) {
    case attention::SparseCombine::kMerged: return a1 || a2;
    case attention::SparseCombine::kAlternating: return c.layer % 2 == 0 ? a1 : a2;
    case attention::SparseCombine::kPerHead: return h < (K + 1) / 2 ? a1 : a2;
  }
  return false;
}

// out[b, h, i] = sum_j w_ij v_j with w_ij = m(d) exp(s_ij) / sum_l m(d_il) exp(s_il), written as loops
// over every (query, key) pair from the formulas in attention/causal_attention.h.
// `weights`, when given, receives w (B, K, N, C).
at::Tensor loop_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Case& c, int64_t R,
                          at::Tensor* weights = nullptr) {
  const int64_t B = q.size(0), K = q.size(1), N = q.size(2), C = k.size(2), D = q.size(3);
  auto out = at::zeros_like(q);
  if (weights) *weights = at::zeros({B, K, N, C}, q.options());
  auto qa = q.accessor<double, 4>(), ka = k.accessor<double, 4>(), va = v.accessor<double, 4>();
  auto oa = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < K; ++h)
      for (int64_t i = 0; i < N; ++i) {
        std::vector<double> w(static_cast<size_t>(C), 0.0);
        double best = -1e300, total = 0;
        std::vector<double> s(static_cast<size_t>(C));
        for (int64_t j = 0; j < C; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qa[b][h][i][e] * ka[b][h][j][e];
          s[j] = dot / std::sqrt(static_cast<double>(D));
        }
        for (int64_t j = 0; j < C; ++j) {
          const int64_t d = (C - N + i) - j + 1;
          double m = d >= 1 ? 1.0 : 0.0;
          if (c.kind == CausalKind::kWindow) m = (d >= 1 && d <= c.window) ? 1.0 : 0.0;
          if (c.kind == CausalKind::kAdaptiveSpan) m = (d >= 1 && d <= c.L) ? nn::span_mask_value(c.z[h], d, R) : 0.0;
          if (c.kind == CausalKind::kSparseStrided || c.kind == CausalKind::kSparseFixed)
            m = sparse_allowed(c, h, K, C - N + i, j) ? 1.0 : 0.0;
          w[j] = m;
          if (m > 0) best = std::max(best, s[j]);
        }
        for (int64_t j = 0; j < C; ++j) w[j] *= std::exp(s[j] - best), total += w[j];
        if (weights)
          for (int64_t j = 0; j < C; ++j) (*weights)[b][h][i][j] = w[j] / total;
        for (int64_t j = 0; j < C; ++j)
          for (int64_t e = 0; e < D; ++e) oa[b][h][i][e] += w[j] / total * va[b][h][j][e];
      }
  return out;
}

using tu::max_diff;

nn::AdaptiveSpan make_span(const std::vector<double>& z, int64_t L, int64_t R) {
  nn::AdaptiveSpan span(nn::AdaptiveSpanOptions(L, static_cast<int64_t>(z.size())).ramp(R));
  span->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  for (size_t h = 0; h < z.size(); ++h) span->span_ratio[static_cast<int64_t>(h)] = z[h] / static_cast<double>(L);
  span->sync_host();
  return span;
}


models::GptModel double_model(const GptModelConfig& config, uint64_t seed = 3) {
  torch::manual_seed(seed);
  models::GptModel model(config);
  model->to(torch::kDouble);
  model->clamp_spans();
  model->eval();
  return model;
}

}  // namespace

// Every pattern and every implementation (plain, fused, auto) against the loop oracle; fused and auto against plain on every
// gradient (q, k, v and the spans), on shapes with and without a cache, tiles that split and spans
// shorter and longer than the keys. Double precision: the three computations differ by rounding only
// (~1e-15 relative), so 1e-12 is tight yet safe.
TEST(GptAttention, EveryPatternMatchesTheLoopOracleAndFusedEqualsPlain) {
  const int64_t R = 8;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {5, 5}, {70, 70}, {131, 131}, {3, 90}, {64, 200}};
  std::vector<Case> cases = {{CausalKind::kDense, 0, {}, 0},          {CausalKind::kFlash, 0, {}, 0},
                             {CausalKind::kWindow, 1, {}, 0},
                             {CausalKind::kWindow, 7, {}, 0},         {CausalKind::kWindow, 100, {}, 0},
                             {CausalKind::kAdaptiveSpan, 0, {0.0, 5.5, 40.2}, 64},
                             {CausalKind::kAdaptiveSpan, 0, {3.0, 64.0, 17.75}, 64},
                             {CausalKind::kAdaptiveSpan, 0, {0.0, 5.5, 12.0}, 64}};  // narrow: all tiles at once
  using attention::SparseCombine;
  for (auto kind : {CausalKind::kSparseStrided, CausalKind::kSparseFixed})
    for (auto [combine, layer] : {std::pair{SparseCombine::kMerged, 0}, std::pair{SparseCombine::kAlternating, 0},
                                  std::pair{SparseCombine::kAlternating, 1}, std::pair{SparseCombine::kPerHead, 0}})
      cases.push_back({kind, 0, {}, 0, kind == CausalKind::kSparseStrided ? 7 : 8, 3, layer, combine});
  for (const auto& [N, C] : shapes)
    for (const auto& c : cases) {
      SCOPED_TRACE(fmt::format("N {} C {} kind {} window {} combine {} layer {}", N, C, attention::causal_kind_name(c.kind),
                               c.window, attention::sparse_combine_name(c.combine), c.layer));
      const int64_t K = c.kind == CausalKind::kWindow || c.kind == CausalKind::kDense ? 2 : 3, D = 4;
      torch::manual_seed(N * 1000 + C);
      auto q = torch::randn({2, K, N, D}, torch::kDouble).requires_grad_();
      auto k = torch::randn({2, K, C, D}, torch::kDouble).requires_grad_();
      auto v = torch::randn({2, K, C, D}, torch::kDouble).requires_grad_();
      nn::AdaptiveSpan span{nullptr};
      attention::CausalSpec spec;
      spec.kind = c.kind;
      spec.window = c.window;
      spec.stride = c.stride;
      spec.summary = c.summary;
      spec.combine = c.combine;
      spec.layer = c.layer;
      spec.heads = K;
      if (c.kind == CausalKind::kAdaptiveSpan) {
        span = make_span(c.z, c.L, R);
        spec.span = span.get();
      }
      at::Tensor oracle_w;  // (2, K, N, C)
      auto oracle = loop_attention(q.detach(), k.detach(), v.detach(), c, R, &oracle_w);
      {  // Recorded weights (attention pictures): the oracle's, by distance, and the same output.
        attention::WeightRecorder recorder;
        EXPECT_LT(max_diff(attention::causal_attention(q.detach(), k.detach(), v.detach(), spec, AttnImpl::kFused), oracle), 1e-12);
        ASSERT_EQ(recorder.layers.size(), 1u);
        const auto& w = recorder.layers[0];  // (2, K, N, C): distance d = 0 .. C - 1
        ASSERT_EQ(w.sizes(), oracle_w.sizes());
        auto expected = torch::zeros_like(w);
        for (int64_t i = 0; i < N; ++i)
          for (int64_t d = 0; d <= C - N + i; ++d)
            expected.select(2, i).select(2, d).copy_(oracle_w.select(2, i).select(2, C - N + i - d));
        EXPECT_LT(max_diff(w, expected), 1e-12);
      }
      auto plain = attention::causal_attention(q, k, v, spec, AttnImpl::kPlain);
      auto fused = attention::causal_attention(q, k, v, spec, AttnImpl::kFused);
      EXPECT_LT(max_diff(plain, oracle), 1e-12);
      EXPECT_LT(max_diff(fused, oracle), 1e-12);
      auto weight = torch::randn_like(plain);
      std::vector<at::Tensor> inputs = {q, k, v};
      if (span) inputs.push_back(span->span_ratio);
      auto gp = torch::autograd::grad({(plain * weight).sum()}, inputs);
      auto gf = torch::autograd::grad({(fused * weight).sum()}, inputs);
      for (size_t i = 0; i < inputs.size(); ++i) EXPECT_LT(max_diff(gp[i], gf[i]), 1e-11) << "gradient " << i;
      // auto: what models run (dense with N = C: PyTorch's fused kernel on LibTorch 2.x).
      auto automatic = attention::causal_attention(q, k, v, spec, AttnImpl::kAuto);
      EXPECT_LT(max_diff(automatic, oracle), 1e-12);
      auto ga = torch::autograd::grad({(automatic * weight).sum()}, inputs);
      for (size_t i = 0; i < inputs.size(); ++i) EXPECT_LT(max_diff(gp[i], ga[i]), 1e-11) << "auto gradient " << i;
      // Groups: sparse patterns split long inputs' query rows (three here; these shapes take one pass);
      // adaptive span splits the heads by band (two and three groups; these spans give one or two).
      std::vector<attention::CausalSpec> grouped_specs;
      if (c.kind == CausalKind::kSparseStrided || c.kind == CausalKind::kSparseFixed) {
        grouped_specs.push_back(spec);
        grouped_specs.back().sparse_groups = 3;
      }
      for (int64_t groups : {2, 3})
        if (c.kind == CausalKind::kAdaptiveSpan) {
          grouped_specs.push_back(spec);
          grouped_specs.back().span_groups = groups;
        }
      for (const auto& grouped_spec : grouped_specs) {
        auto grouped = attention::causal_attention(q, k, v, grouped_spec, AttnImpl::kFused);
        EXPECT_LT(max_diff(grouped, oracle), 1e-12);
        auto gg = torch::autograd::grad({(grouped * weight).sum()}, inputs);
        for (size_t i = 0; i < inputs.size(); ++i) EXPECT_LT(max_diff(gp[i], gg[i]), 1e-11) << "grouped gradient " << i;
      }
    }
}

// The soft span's gradient is right, not only equal between paths: central differences.
TEST(GptAttention, SpanGradientMatchesFiniteDifferences) {
  auto span = make_span({6.3, 20.7}, 32, 8);
  attention::CausalSpec spec;
  spec.kind = CausalKind::kAdaptiveSpan;
  spec.span = span.get();
  torch::manual_seed(5);
  auto q = torch::randn({1, 2, 40, 4}, torch::kDouble).requires_grad_();
  auto k = torch::randn({1, 2, 40, 4}, torch::kDouble).requires_grad_();
  auto v = torch::randn({1, 2, 40, 4}, torch::kDouble).requires_grad_();
  auto weight = torch::randn({1, 2, 40, 4}, torch::kDouble);
  tu::expect_finite_differences([&] { return (attention::causal_attention(q, k, v, spec, AttnImpl::kFused) * weight).sum(); },
                                {q, k, v, span->span_ratio});
}

TEST(GptAttention, BadShapesAreOneLineErrors) {
  attention::CausalSpec spec;
  auto q = torch::randn({1, 2, 5, 4}), k = torch::randn({1, 2, 4, 4});
  EXPECT_NE(tu::error_of([&] { attention::causal_attention(q, k, k, spec); }).find("C >= N >= 1"), std::string::npos);
  EXPECT_NE(tu::error_of([&] { attention::parse_causal_kind("flashy"); }).find("dense, flash, window, adaptive_span"),
            std::string::npos);
}

// The whole model, fused against plain: loss and the gradient of every parameter (double precision).
const CausalKind kAllKinds[] = {CausalKind::kDense,         CausalKind::kFlash,       CausalKind::kWindow,
                                CausalKind::kAdaptiveSpan,  CausalKind::kSparseStrided, CausalKind::kSparseFixed,
                                CausalKind::kLsh};

TEST(GptModel, FusedModelEqualsPlainModelWithGradients) {
  for (auto kind : kAllKinds) {
    SCOPED_TRACE(attention::causal_kind_name(kind));
    auto config = tiny_gpt(kind, 150);  // three query tiles
    config.model.window = 70;
    config.model.adapt_span_init = 0.3;
    config.model.attn_impl = AttnImpl::kPlain;
    auto plain = double_model(config.model);
    config.model.attn_impl = AttnImpl::kFused;
    auto fused = double_model(config.model);
    torch::manual_seed(9);
    auto x = torch::randint(11, {2, 150}, torch::kLong), y = torch::randint(11, {2, 150}, torch::kLong);
    auto loss = [&](models::GptModel& m) {
      torch::manual_seed(21);  // lsh draws its rotations: the same for both models
      auto logits = m->logits(m->forward(x));
      return torch::cross_entropy_loss(logits.reshape({-1, 11}), y.reshape({-1})) + m->span_loss();
    };
    auto lp = loss(plain), lf = loss(fused);
    EXPECT_LT(std::abs(lp.item<double>() - lf.item<double>()), 1e-12);
    lp.backward();
    lf.backward();
    auto pp = plain->named_parameters(), pf = fused->named_parameters();
    for (const auto& item : pp) EXPECT_LT(max_diff(item.value().grad(), pf[item.key()].grad()), 1e-11) << item.key();
  }
}

// Changing token j changes nothing at positions before j.
TEST(GptModel, AttentionIsCausal) {
  for (auto kind : kAllKinds)
    for (auto impl : {AttnImpl::kPlain, AttnImpl::kFused}) {
      auto config = tiny_gpt(kind, 100);
      config.model.attn_impl = impl;
      auto model = double_model(config.model);
      torch::manual_seed(2);
      auto x = torch::randint(11, {1, 100}, torch::kLong);
      auto changed = x.clone();
      changed.narrow(1, 60, 40).random_(0, 11);
      torch::manual_seed(31);  // lsh: the same rotations for both
      auto before = model->logits(model->forward(x));
      torch::manual_seed(31);
      auto after = model->logits(model->forward(changed));
      // Bit for bit, except lsh: later tokens may move an earlier query's keys to other chunk slots,
      // which reorders its sums (the same keys and weights: rounding only).
      EXPECT_LE(max_diff(before.narrow(1, 0, 60), after.narrow(1, 0, 60)), kind == CausalKind::kLsh ? 1e-13 : 0.0)
          << attention::causal_kind_name(kind);
      EXPECT_GT(max_diff(before.narrow(1, 60, 40), after.narrow(1, 60, 40)), 0.0);
    }
}

// Generation with the KV cache (trimmed to the band or not) gives the hidden states of recomputing the
// whole context at every step, through context slides (2.5 T tokens).
TEST(GptModel, KvCacheGenerationEqualsRecomputation) {
  for (auto kind : kAllKinds)
    for (auto positions : {Positions::kLearned, Positions::kSinusoidal}) {
      SCOPED_TRACE(fmt::format("{} {}", attention::causal_kind_name(kind), positions_name(positions)));
      auto config = tiny_gpt(kind, 24);
      config.model.positions = positions;
      auto model = double_model(config.model);
      torch::NoGradGuard no_grad;
      models::GptDecoder recompute, cached, untrimmed;
      recompute.use_cache = false;
      untrimmed.trim = false;
      torch::manual_seed(4);
      auto tokens = torch::randint(11, {1, 60}, torch::kLong);
      // Each call under the same random state (lsh draws rotations per call; it reads no cache).
      auto extend = [&](const torch::Tensor& x, models::GptDecoder& d, int64_t call) {
        torch::manual_seed(100 + call);
        return model->extend(x, d);
      };
      auto prompt = tokens.narrow(1, 0, 10);
      auto r = extend(prompt, recompute, 0);
      EXPECT_LT(max_diff(extend(prompt, cached, 0), r), 1e-12);
      EXPECT_LT(max_diff(extend(prompt, untrimmed, 0), r), 1e-12);
      for (int64_t i = 1; i <= 50; ++i) {
        auto token = tokens.narrow(1, 9 + i, 1);
        auto expected = extend(token, recompute, i);
        EXPECT_LT(max_diff(extend(token, cached, i), expected), 1e-12) << "token " << i;
        EXPECT_LT(max_diff(extend(token, untrimmed, i), expected), 1e-12) << "token " << i;
      }
      if (kind == CausalKind::kLsh) EXPECT_TRUE(cached.cache.k.empty());  // lsh recomputes
      EXPECT_GT(recompute.start, 0);  // the context slid
      if (kind == CausalKind::kWindow) EXPECT_EQ(cached.cache.k[0].size(2), 4);  // w - 1 keys kept
      if (kind == CausalKind::kDense) EXPECT_EQ(cached.cache.k[0].size(2), untrimmed.cache.k[0].size(2));
    }
}

// The decoding layout (lay_out_for_decoding, what generate calls): every parameter keeps its values and
// shape bit for bit, the block weights become transposed storage, and the KV-cache generation gives the
// recomputation's hidden states (double: the products' order is the only difference, within 1e-12).
TEST(GptModel, DecodingLayoutKeepsEveryValue) {
  auto config = tiny_gpt(CausalKind::kDense, 24);
  auto model = double_model(config.model);
  std::vector<torch::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  models::GptDecoder recompute;
  recompute.use_cache = false;
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  auto tokens = torch::randint(11, {1, 40}, torch::kLong);
  auto want = model->extend(tokens.narrow(1, 0, 10), recompute);
  model->lay_out_for_decoding();
  const auto after = model->parameters();
  ASSERT_EQ(after.size(), before.size());
  int64_t transposed = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].sizes(), before[i].sizes());
    EXPECT_TRUE(torch::equal(after[i], before[i])) << "parameter " << i;
    transposed += after[i].dim() == 2 && !after[i].is_contiguous() && after[i].t().is_contiguous();
  }
  EXPECT_EQ(transposed, 4 * config.model.n_layer);  // qkv, proj, fc1, fc2 of each block
  models::GptDecoder cached;
  EXPECT_LT(max_diff(model->extend(tokens.narrow(1, 0, 10), cached), want), 1e-12);
  for (int64_t i = 10; i < 40; ++i)
    EXPECT_LT(max_diff(model->extend(tokens.narrow(1, i, 1), cached), model->extend(tokens.narrow(1, i, 1), recompute)),
              1e-12) << "token " << i;
}

// bfloat16 decoding (`generate --dtype bfloat16`: the model cast once, then laid out for decoding, its
// one-row products each way of multiplying bfloat16: matvec.h): the prompt's and each cached step's
// logits within bfloat16's error of the float32 model's (its own one-row products), for every pattern
// with a KV cache (LSH, which has none, hashes by the argmax of rotated bfloat16 vectors: a tie broken
// the other way puts a key in another bucket, a discrete change no bound on rounding covers).
// Bound: 8 ulps of bfloat16 (2^-8 relative) of the largest logit: each product and sum rounds to 8 bits
// of mantissa, over 2 layers.
TEST(GptModel, BFloat16DecodingFollowsFloat32) {
  for (auto way : {ops::cpu::HalfProducts::widened, ops::cpu::HalfProducts::native})
    for (auto kind : kAllKinds) {
      if (kind == CausalKind::kLsh) continue;
      if (way == ops::cpu::HalfProducts::native && !ops::cpu::half_products_available()) continue;  // refused: no brgemm
      ops::cpu::HalfProductsOverride products(way);
      SCOPED_TRACE(fmt::format("{}, bf16 products {}", attention::causal_kind_name(kind),
                               ops::cpu::decode_bf16_pairs() ? "AVX512-BF16 pairs" : "widened"));
      auto config = tiny_gpt(kind, 24);
      torch::manual_seed(3);
      models::GptModel f32(config.model), bf16(config.model);
      for (auto model : {f32, bf16}) model->eval();
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < f32->parameters().size(); ++i) bf16->parameters()[i].copy_(f32->parameters()[i]);
      f32->clamp_spans();
      bf16->clamp_spans();
      f32->lay_out_for_decoding();
      bf16->to(torch::kBFloat16);
      bf16->lay_out_for_decoding();
      for (const auto& p : bf16->parameters())  // (out, in) storage: the one-row products take them
        if (p.dim() == 2) ASSERT_TRUE(p.is_contiguous());
      models::GptDecoder a, b;
      torch::manual_seed(4);
      auto tokens = torch::randint(11, {1, 30}, torch::kLong);
      for (int64_t i = 0; i < 20; ++i) {
        auto x = i == 0 ? tokens.narrow(1, 0, 10) : tokens.narrow(1, 9 + i, 1);
        auto want = f32->logits(f32->extend(x, a));
        auto got = bf16->logits(bf16->extend(x, b));
        ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
        EXPECT_LT((got.to(torch::kFloat) - want).abs().max().item<double>(),
                  8 * std::pow(2.0, -8) * want.abs().max().item<double>())
            << "step " << i;
      }
    }
}

// A batch decoded together (bench --mode generate --batch: each step's rows through one streaming
// product, ops/cpu/matvec.h) gives each row's logits decoded alone, float32 and bfloat16 (each way of
// multiplying it), 8 rows: within float32 rounding of the products' other order (1e-5 of the largest
// logit; bfloat16: 2 ulps, 2^-7, where one rounding may fall the other way), where rows mixed up
// would be off by the logits' own size.
TEST(GptModel, BatchedDecodingGivesEachRowAlone) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16})
    for (auto way : {ops::cpu::HalfProducts::widened, ops::cpu::HalfProducts::native}) {
      if (way == ops::cpu::HalfProducts::native && (dtype == torch::kFloat || !ops::cpu::half_products_available()))
        continue;
      ops::cpu::HalfProductsOverride products(way);
      SCOPED_TRACE(fmt::format("{}{}", c10::toString(dtype), dtype == torch::kFloat ? "" : ops::cpu::decode_bf16_pairs() ? ", pairs" : ", widened"));
      auto config = tiny_gpt(CausalKind::kDense, 24);
      torch::manual_seed(3);
      models::GptModel model(config.model);
      model->eval();
      torch::NoGradGuard no_grad;
      model->to(dtype);
      model->lay_out_for_decoding();
      torch::manual_seed(4);
      const int64_t B = 8;
      auto tokens = torch::randint(11, {B, 20}, torch::kLong);
      models::GptDecoder together;
      std::vector<models::GptDecoder> alone(B);
      for (int64_t i = 0; i < 10; ++i) {
        auto x = i == 0 ? tokens.narrow(1, 0, 11) : tokens.narrow(1, 10 + i, 1);  // (B, n)
        auto got = model->logits(model->extend(x, together).narrow(1, -1, 1)).to(torch::kFloat);  // (B, 1, V)
        for (int64_t b = 0; b < B; ++b) {
          auto want = model->logits(model->extend(x.narrow(0, b, 1), alone[b]).narrow(1, -1, 1)).to(torch::kFloat);
          const double tol = (dtype == torch::kFloat ? 1e-5 : std::pow(2.0, -7)) * want.abs().max().item<double>();
          EXPECT_LT((got.narrow(0, b, 1) - want).abs().max().item<double>(), tol) << "step " << i << " row " << b;
        }
      }
    }
}

// Generation at fixed shapes (what the lab's CUDA graph captures: GptDecoder::fixed_shapes) gives
// the hidden states of recomputing the whole context, for every pattern with a KV cache, plain and
// reversible layers, through context slides; each single token runs through the runner (the graph's
// place) and the buffers keep their storage across slides (a captured graph reads them).
TEST(GptModel, FixedShapeGenerationEqualsRecomputation) {
  for (auto kind : kAllKinds)
    for (bool reversible : {false, true}) {
      if (kind == CausalKind::kLsh) continue;  // refused: below
      SCOPED_TRACE(fmt::format("{}{}", attention::causal_kind_name(kind), reversible ? " reversible" : ""));
      auto config = tiny_gpt(kind, 24);
      config.model.reversible = reversible;
      auto model = double_model(config.model);
      torch::NoGradGuard no_grad;
      models::GptDecoder recompute, fixed;
      recompute.use_cache = false;
      fixed.fixed_shapes = true;
      int64_t steps = 0;
      fixed.runner = [&](const torch::Tensor& x, const torch::Tensor& at, const models::GptStepFn& step) {
        ++steps;
        EXPECT_EQ(at.item<int64_t>(), static_cast<int64_t>(fixed.history.size()) - fixed.start - 1);
        return step(x, at);
      };
      torch::manual_seed(4);
      auto tokens = torch::randint(11, {1, 60}, torch::kLong);
      auto prompt = tokens.narrow(1, 0, 10);
      auto r = model->extend(prompt, recompute);
      EXPECT_LT(max_diff(model->extend(prompt, fixed), r), 1e-12);
      ASSERT_EQ(fixed.fixed.k.size(), 2u);
      EXPECT_EQ(fixed.fixed.k[0].size(2), 24);  // the whole context
      const void* storage = fixed.fixed.k[1].data_ptr();
      for (int64_t i = 1; i <= 50; ++i) {
        auto token = tokens.narrow(1, 9 + i, 1);
        EXPECT_LT(max_diff(model->extend(token, fixed), model->extend(token, recompute)), 1e-12) << "token " << i;
      }
      EXPECT_GT(recompute.start, 0);            // the context slid
      EXPECT_EQ(fixed.start, recompute.start);
      EXPECT_EQ(steps, 50 - 3);                 // every single token but those that slid (at 25, 38, 51 tokens)
      EXPECT_EQ(fixed.fixed.k[1].data_ptr(), storage);
    }
  auto model = double_model(tiny_gpt(CausalKind::kLsh, 24).model);
  torch::NoGradGuard no_grad;
  models::GptDecoder fixed;
  fixed.fixed_shapes = true;
  try {
    model->extend(torch::zeros({1, 3}, torch::kLong), fixed);
    ADD_FAILURE() << "lsh generated at fixed shapes";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("generation at fixed shapes: lsh attention keeps no KV cache"), std::string::npos)
        << e.what();
  }
}

TEST(GptModel, SinusoidalTableFollowsTheFormula) {
  auto table = nn::sinusoidal_positions(50, 8);
  for (int64_t p : {0, 7, 49})
    for (int64_t i = 0; i < 4; ++i) {
      const double angle = static_cast<double>(p) / std::pow(10000.0, 2.0 * static_cast<double>(i) / 8.0);
      EXPECT_NEAR(table[p][2 * i].item<double>(), std::sin(angle), 1e-6);
      EXPECT_NEAR(table[p][2 * i + 1].item<double>(), std::cos(angle), 1e-6);
    }
}

// The sliding-window evaluation against a direct computation: each target t scored once, by the window
// the rule in src/train/families/gpt/family.cpp assigns (written out again here).
TEST(GptEval, SlidingWindowScoresEveryTokenOnceAsTheRuleSays) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 3000);
  auto corpus = data::load_corpus(tmp.path());
  const auto& tokens = *corpus.test;
  const int64_t T = 16, n = tokens.size();
  for (int64_t stride : {1, 5, 16}) {
    SCOPED_TRACE(stride);
    auto config = tiny_gpt(CausalKind::kDense, T);
    config.model.vocab_size = corpus.vocab.size();
    config.model.eval_stride = stride;
    auto json = to_json(config);
    auto family = train::family_from_json(json, "test");
    torch::manual_seed(1);
    family->build();
    family->module().to(torch::kDouble);
    auto& model = dynamic_cast<models::GptModelImpl&>(family->module());
    train::EvalRequest request;
    request.batch = 3;
    request.dump_logprobs = tmp.file("lp.txt");
    auto report = family->need<train::TokenStreams>().evaluate(tokens, request);
    EXPECT_EQ(report.tokens, n - 1);
    // Direct: target t (predicting token t + 1) is scored in the window that ends at e(t) =
    // the first of T, T + stride, T + 2 stride, ... (capped at n - 1) above t, starting at e(t) - T.
    torch::NoGradGuard no_grad;
    model.eval();
    double nll = 0;
    std::ifstream dump(tmp.file("lp.txt"));
    for (int64_t t = 0; t < n - 1; ++t) {
      int64_t end = T;
      while (end <= t) end = std::min(end + stride, n - 1);
      std::vector<int64_t> ids;
      for (int64_t i = end - T; i < end; ++i) ids.push_back(tokens.at(i));
      auto x = torch::tensor(ids, torch::kLong).view({1, T});
      auto lp = torch::log_softmax(model.logits(model.forward(x)), -1)[0][t - (end - T)][tokens.at(t + 1)].item<double>();
      nll -= lp;
      double dumped = 0;
      dump >> dumped;
      EXPECT_NEAR(dumped, lp, 1e-6) << "target " << t;
    }
    EXPECT_NEAR(report.nll, nll / static_cast<double>(n - 1), 1e-9);
  }
}

// AdamW: p <- p (1 - lr wd) for matrices, then Adam with beta2; vectors are not decayed.
TEST(GptOptim, AdamWDecouplesWeightDecayForMatricesOnly) {
  auto w = torch::tensor({{1.0, -2.0}, {0.5, 3.0}}, torch::kDouble).requires_grad_();
  auto b = torch::tensor({0.25, -0.75}, torch::kDouble).requires_grad_();
  train::OptimizerOptions o;
  o.kind = OptimKind::kAdamW;
  o.weight_decay = 0.1;
  o.beta2 = 0.95;
  train::Optimizer opt({{"w", w}, {"b", b}}, o);
  auto w_ref = w.detach().clone(), b_ref = b.detach().clone();
  auto m_w = torch::zeros_like(w_ref), v_w = torch::zeros_like(w_ref), m_b = torch::zeros_like(b_ref), v_b = torch::zeros_like(b_ref);
  for (int step = 1; step <= 3; ++step) {
    const double lr = 0.01 * step;
    opt.zero_grad();
    ((w * w).sum() * 0.5 + (b * b * b).sum()).backward();
    auto gw = w_ref.clone(), gb = 3 * b_ref * b_ref;  // the same gradients, from the reference weights
    EXPECT_LT(max_diff(w.grad(), gw), 1e-15);
    opt.step(lr);
    const double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.95, step);
    w_ref.mul_(1 - lr * 0.1);
    m_w = 0.9 * m_w + 0.1 * gw, v_w = 0.95 * v_w + 0.05 * gw * gw;
    w_ref -= lr / c1 * m_w / (torch::sqrt(v_w) / std::sqrt(c2) + 1e-8);
    m_b = 0.9 * m_b + 0.1 * gb, v_b = 0.95 * v_b + 0.05 * gb * gb;
    b_ref -= lr / c1 * m_b / (torch::sqrt(v_b) / std::sqrt(c2) + 1e-8);
    EXPECT_LT(max_diff(w.detach(), w_ref), 1e-14);
    EXPECT_LT(max_diff(b.detach(), b_ref), 1e-14);
  }
}

TEST(GptConfig, NonsenseValuesAreRefusedNamingTheKey) {
  auto bad = [](const std::vector<std::string>& overrides) {
    nlohmann::json j = to_json(GptConfig{});
    return tu::error_of([&] {
      auto family = train::family_from_json(j, "test", overrides);
      family->validate();
    });
  };
  EXPECT_NE(bad({"--d_model=30", "--n_head=4"}).find("multiple of n_head"), std::string::npos);
  EXPECT_NE(bad({"--attn_span=999"}).find("attn_span"), std::string::npos);
  EXPECT_NE(bad({"--attention=lsh2"}).find("config key 'attention'"), std::string::npos);
  EXPECT_NE(bad({"--positions=rotary"}).find("learned or sinusoidal"), std::string::npos);
  EXPECT_NE(bad({"--window=0"}).find("window"), std::string::npos);
  EXPECT_NE(bad({"--weight_decay=0.1", "--optim=adagrad"}).find("adam and adamw only"), std::string::npos);
  EXPECT_EQ(bad({}), "");
}

// A small GPT of one attention training on `data` (bytes): dropout on, random contexts.
GptConfig training_gpt(attention::CausalKind kind, const std::string& data, int64_t steps, int64_t interval) {
  GptConfig c = tiny_gpt(kind, 32);
  c.model.vocab_size = 0;
  c.model.d_model = 32;
  c.model.dropout = 0.1;
  c.train.data = data;
  c.train.batch_size = 8;
  c.train.nb_steps = steps;
  c.train.lr_warmup = 5;
  c.train.lr = 3e-3;
  c.train.eval_interval = interval;
  c.train.eval_blocks = 2;
  c.train.threads = 0;  // OMP_NUM_THREADS (one under scripts/test.sh), else every core
  return c;
}

// Every attention trains on the engine: the loss falls on real text, and a stopped + resumed run
// (dropout on, random contexts) ends bit for bit where an uninterrupted one does.
TEST(GptTraining, EveryAttentionLearnsAndResumesBitForBit) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 30000);
  for (auto kind : kAllKinds) {
    SCOPED_TRACE(attention::causal_kind_name(kind));
    const GptConfig c = training_gpt(kind, tmp.path(), 100, 50);
    const std::string name = attention::causal_kind_name(kind);
    auto full = tu::run_family(to_json(c), tmp.file(name + "_a"));
    EXPECT_LT(full.last_valid, 4.7) << "bits per byte after 100 steps";  // uniform over ~80 bytes: 6.3, unigram ~4.4
    tu::run_family(to_json(c), tmp.file(name + "_b"), false, 37);
    tu::run_family(to_json(c), tmp.file(name + "_b"), true);
    tu::expect_same_checkpoint(tmp.file(name + "_a/checkpoint.pt"), tmp.file(name + "_b/checkpoint.pt"));
  }
}

// The same numbers from the same command: two runs of every attention with 2 threads end in
// bit-identical checkpoints, and evaluating one twice gives the same figure (LSH draws its rotations in
// eval too: they come from the run's seed, not from LibTorch's generator, which starts anywhere).
TEST(GptTraining, RepeatedRunsAndEvaluationsAreBitIdentical) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 30000);
  for (auto kind : kAllKinds) {
    SCOPED_TRACE(attention::causal_kind_name(kind));
    GptConfig c = training_gpt(kind, tmp.path(), 12, 12);
    c.train.threads = 2;
    const std::string name = attention::causal_kind_name(kind);
    tu::run_family(to_json(c), tmp.file(name + "_a"));
    tu::run_family(to_json(c), tmp.file(name + "_b"));
    tu::expect_same_checkpoint(tmp.file(name + "_a/checkpoint.pt"), tmp.file(name + "_b/checkpoint.pt"));
    train::Checkpoint ck(tmp.file(name + "_a/checkpoint.pt"));
    auto family = train::family_from_checkpoint(ck, {});
    train::CheckpointEval request;
    request.split = "valid";
    const double first = train::evaluate_checkpoint(ck, *family, request).record["nll"].get<double>();
    const double second = train::evaluate_checkpoint(ck, *family, request).record["nll"].get<double>();
    EXPECT_EQ(first, second);
  }
}

// train.amp = bf16 (tests/util.h) with every attention.
TEST(GptTraining, MixedPrecisionBf16TrainsEveryAttentionAndResumesBitForBit) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 30000);
  for (auto kind : kAllKinds) {
    SCOPED_TRACE(attention::causal_kind_name(kind));
    tu::expect_bf16_run(to_json(training_gpt(kind, tmp.path(), 30, 15)),
                        tmp.file(attention::causal_kind_name(kind)), 17, 0.03);
  }
}

// The float32 product, each layout of W, for one row (a step at batch 1), 3, 8 and 16 rows (a batch's
// step; the bfloat16 rows take groups of 8, 4, 2, 1), within the float64 product: each output is a sum
// of K products and the bias, at most (K + 1) 2^-24 sum |x w| + |b| off in float32. Two threads, ten
// runs bit for bit.
TEST(DecodeMatvec, EachLayoutWithinTheFloat64Product) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const auto dtype = at::kFloat;
  for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{768, 2304}, {301, 7}, {5, 333}, {1, 1}})
    for (int64_t R : {1, 3, 8, 16})
      for (bool in_out : {true, false})
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(::testing::Message() << "K " << K << " N " << N << " R " << R
                                            << (in_out ? " (in, out)" : " (out, in)") << (with_bias ? " bias" : ""));
          torch::manual_seed(K * 7 + N + R);
          auto w = torch::randn({N, K}).to(dtype);                            // (out, in)
          if (in_out) w = w.t().contiguous().t();                             // (in, out) storage
          auto x = torch::randn({R, 1, K}).to(dtype);                          // R rows
          auto b = with_bias ? torch::randn({N}).to(dtype) : at::Tensor();
          torch::NoGradGuard no_grad;
          auto y = ops::cpu::decode_linear(x, w, b);
          ASSERT_TRUE(y.defined());
          ASSERT_EQ(y.sizes(), (std::vector<int64_t>{R, 1, N}));
          ASSERT_EQ(y.scalar_type(), dtype);
          auto wd = w.to(at::kDouble), xd = x.reshape({R, K}).to(at::kDouble);
          auto bd = with_bias ? b.to(at::kDouble) : at::zeros({N}, at::kDouble);
          auto want = at::mm(xd, wd.t()) + bd;  // (R, N)
          auto scale = at::mm(xd.abs(), wd.abs().t()) + bd.abs();
          auto allowed = scale * (static_cast<double>(K + 1) * std::pow(2.0, -24));
          auto err = (y.reshape({R, N}).to(at::kDouble) - want).abs();
          EXPECT_TRUE((err <= allowed).all().item<bool>()) << "worst excess " << (err - allowed).max().item<double>();
          for (int r = 0; r < 10; ++r) ASSERT_TRUE(torch::equal(ops::cpu::decode_linear(x, w, b), y)) << "run " << r;
        }
  at::set_num_threads(threads);
}

// bfloat16 weights (out, in), each way of multiplying them (widened to float32; AVX512-BF16's pairs where
// the CPU has them, which the test checks from cpuid itself), 1, 3, 8 and 16 rows, within the float64
// product of the same bfloat16 values: each product of two bfloat16 values is exact in float32 (8 + 8
// bits of significand), so the float32 sums are the error, at most (K + 1) 2^-24 sum |x w| + |b| as in
// float32, and the one rounding to bfloat16 after adds at most half an ulp: 2^-8 of the sum (8 bits of
// significand). Lengths not a multiple of 32 take the pairs' masked tail; two threads, ten runs bit for bit.
TEST(DecodeMatvec, BFloat16EachWayWithinTheFloat64Product) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
#if defined(__x86_64__) && defined(__GNUC__)
  const bool pairs_here = ops::cpu::vector_level() == ops::cpu::VectorLevel::avx512 &&
                          ops::cpu::half_products_in_hardware(at::kBFloat16) && __builtin_cpu_supports("avx512bf16");
#else
  const bool pairs_here = false;
#endif
  for (auto way : {ops::cpu::HalfProducts::widened, ops::cpu::HalfProducts::native}) {
    if (way == ops::cpu::HalfProducts::native && !ops::cpu::half_products_available()) continue;  // refused: no brgemm
    ops::cpu::HalfProductsOverride products(way);
    const bool pairs = way == ops::cpu::HalfProducts::native && pairs_here;
    ASSERT_EQ(ops::cpu::decode_bf16_pairs(), pairs);
    for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{768, 2304}, {3072, 768}, {301, 7}, {40, 333}, {1, 1}})
      for (int64_t R : {1, 3, 8, 16})
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(::testing::Message() << (pairs ? "pairs" : "widened") << " K " << K << " N " << N << " R " << R
                                            << (with_bias ? " bias" : ""));
          torch::manual_seed(K * 7 + N + R);
          auto w = torch::randn({N, K}).to(at::kBFloat16);  // (out, in)
          auto x = torch::randn({1, R, K}).to(at::kBFloat16);
          auto b = with_bias ? torch::randn({N}).to(at::kBFloat16) : at::Tensor();
          torch::NoGradGuard no_grad;
          auto y = ops::cpu::decode_linear(x, w, b);
          ASSERT_TRUE(y.defined());
          ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, R, N}));
          ASSERT_EQ(y.scalar_type(), at::kBFloat16);
          auto wd = w.to(at::kDouble), xd = x.reshape({R, K}).to(at::kDouble);
          auto bd = with_bias ? b.to(at::kDouble) : at::zeros({N}, at::kDouble);
          auto want = at::mm(xd, wd.t()) + bd;  // (R, N)
          auto sums = (at::mm(xd.abs(), wd.abs().t()) + bd.abs()) * (static_cast<double>(K + 1) * std::pow(2.0, -24));
          auto allowed = sums + (want.abs() + sums) * std::pow(2.0, -8);
          auto err = (y.reshape({R, N}).to(at::kDouble) - want).abs();
          EXPECT_TRUE((err <= allowed).all().item<bool>()) << "worst excess " << (err - allowed).max().item<double>();
          for (int r = 0; r < 10; ++r) ASSERT_TRUE(torch::equal(ops::cpu::decode_linear(x, w, b), y)) << "run " << r;
        }
  }
  at::set_num_threads(threads);
}

// Where the streaming product does not apply it says so (an undefined tensor) and the caller runs
// at::linear: more rows than kDecodeRows, a gradient asked for, float64, bfloat16 stored (in, out), a
// float32 weight stored neither way, another dtype of x.
TEST(DecodeMatvec, LeavesEverythingElseToLinear) {
  auto w = torch::randn({6, 4}), x = torch::randn({1, 4});
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(ops::cpu::decode_linear(x, w, {}).defined());
    EXPECT_TRUE(ops::cpu::decode_linear(torch::randn({ops::cpu::kDecodeRows, 4}), w, {}).defined());
    EXPECT_FALSE(ops::cpu::decode_linear(torch::randn({ops::cpu::kDecodeRows + 1, 4}), w, {}).defined());
    EXPECT_FALSE(ops::cpu::decode_linear(x.to(at::kDouble), w.to(at::kDouble), {}).defined());
    EXPECT_TRUE(ops::cpu::decode_linear(x.to(at::kBFloat16), w.to(at::kBFloat16), {}).defined());
    EXPECT_FALSE(ops::cpu::decode_linear(x.to(at::kBFloat16), w.t().contiguous().t().to(at::kBFloat16), {}).defined());
    EXPECT_FALSE(ops::cpu::decode_linear(x, torch::randn({6, 8}).narrow(1, 0, 4), {}).defined());
    EXPECT_FALSE(ops::cpu::decode_linear(x.to(at::kBFloat16), w, {}).defined());
  }
  auto wg = w.clone().requires_grad_();
  EXPECT_FALSE(ops::cpu::decode_linear(x, wg, {}).defined());
}
