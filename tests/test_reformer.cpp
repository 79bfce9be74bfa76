// The Reformer's parts: LSH attention (ops/lsh_attention.h) against a loop oracle written from
// the header's definition of A_r(i) and against its plain composition (values and gradients, double
// precision), its exact causality, and the reversible layers and chunked feed-forward of the GPT model
// (models/gpt.h) against autograd through the same composition, dropout and LSH rotations included;
// training with both resumes bit for bit. Tolerances: double precision, the computations differ by
// rounding only (~1e-15 relative), so 1e-12 on values, 1e-10 on gradients that pass through a dozen
// layers' reconstruction x2 = y2 - G(y1) (each adds rounding of |y| ~ 1).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "spanformer/config/gpt_config.h"
#include "spanformer/models/gpt.h"
#include "spanformer/ops/lsh_attention.h"
#include "spanformer/train/checkpoint.h"
#include "gpt_util.h"
#include "util.h"

using namespace spanformer;
using attention::CausalKind;

namespace {

using tu::max_diff;

// Loops over the header's definitions: bucket = argmax([x A; -x A]) (factorised: digit by digit, each
// factor's columns of A in turn, the first factor most significant); A_r(i) = itself and the m most
// recent earlier positions of its bucket; self only when alone; rounds combined by logsumexp.
at::Tensor loop_lsh(const at::Tensor& q, const at::Tensor& v, const at::Tensor& rot, int64_t m,
                    std::vector<int64_t> factors = {}) {
  const int64_t B = q.size(0), K = q.size(1), N = q.size(2), D = q.size(3), R = rot.size(1);
  if (factors.empty()) factors = {2 * rot.size(3)};
  auto out = at::zeros_like(q);
  auto qa = q.accessor<double, 4>(), va = v.accessor<double, 4>(), ra = rot.accessor<double, 4>();
  auto oa = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < K; ++h) {
      std::vector<std::vector<double>> unit(N, std::vector<double>(D));
      for (int64_t i = 0; i < N; ++i) {
        double norm = 0;
        for (int64_t e = 0; e < D; ++e) norm += qa[b][h][i][e] * qa[b][h][i][e];
        for (int64_t e = 0; e < D; ++e) unit[i][e] = qa[b][h][i][e] / std::sqrt(norm);
      }
      std::vector<std::vector<double>> lse(R, std::vector<double>(N)), o(R * N, std::vector<double>(D, 0.0));
      for (int64_t r = 0; r < R; ++r) {
        std::vector<int64_t> bucket(N, 0);
        for (int64_t i = 0; i < N; ++i) {
          int64_t first = 0;  // the factor's first column of A
          for (int64_t f : factors) {
            const int64_t half = f / 2;
            double best = -1e300;
            int64_t digit = 0;
            for (int64_t c = 0; c < 2 * half; ++c) {
              double x = 0;
              for (int64_t e = 0; e < D; ++e) x += qa[b][h][i][e] * ra[h][r][e][first + c % half];
              if (c >= half) x = -x;
              if (x > best) best = x, digit = c;
            }
            bucket[i] = bucket[i] * f + digit;
            first += half;
          }
        }
        for (int64_t i = 0; i < N; ++i) {
          std::vector<int64_t> keys;  // the m most recent earlier positions of i's bucket
          for (int64_t j = i - 1; j >= 0 && static_cast<int64_t>(keys.size()) < m; --j)
            if (bucket[j] == bucket[i]) keys.push_back(j);
          std::vector<double> s;
          if (keys.empty()) {
            keys.push_back(i);  // alone: itself
            s.push_back(-1e9);
          } else {
            for (int64_t j : keys) {
              double dot = 0;
              for (int64_t e = 0; e < D; ++e) dot += qa[b][h][i][e] * unit[j][e];
              s.push_back(dot / std::sqrt(static_cast<double>(D)));
            }
          }
          const double top = *std::max_element(s.begin(), s.end());
          double z = 0;
          for (double x : s) z += std::exp(x - top);
          lse[r][i] = top + std::log(z);
          for (size_t t = 0; t < keys.size(); ++t)
            for (int64_t e = 0; e < D; ++e) o[r * N + i][e] += std::exp(s[t] - lse[r][i]) * va[b][h][keys[t]][e];
        }
      }
      for (int64_t i = 0; i < N; ++i) {
        double top = -1e300, z = 0;
        for (int64_t r = 0; r < R; ++r) top = std::max(top, lse[r][i]);
        for (int64_t r = 0; r < R; ++r) z += std::exp(lse[r][i] - top);
        for (int64_t r = 0; r < R; ++r)
          for (int64_t e = 0; e < D; ++e) oa[b][h][i][e] += std::exp(lse[r][i] - top) / z * o[r * N + i][e];
      }
    }
  return out;
}

// tu::tiny_gpt with three layers (the reversible stack rebuilds through two) and four LSH buckets.
GptConfig tiny(CausalKind kind, int64_t T) {
  GptConfig c = tu::tiny_gpt(kind, T);
  c.model.n_layer = 3;
  c.model.lsh_buckets = 4;
  return c;
}

}  // namespace

TEST(LshAttention, MatchesTheLoopOracleAndThePlainComposition) {
  struct Case {
    int64_t N, chunk, rounds, buckets;
  };
  // 72 buckets are factorised (6 x 12): two digits per round.
  for (const auto& c : std::vector<Case>{{1, 4, 1, 2}, {5, 4, 2, 2}, {37, 4, 1, 4}, {37, 8, 3, 4}, {64, 8, 2, 8},
                                         {130, 16, 2, 8}, {50, 64, 2, 2}, {90, 4, 2, 72}}) {
    SCOPED_TRACE(fmt::format("N {} chunk {} rounds {} buckets {}", c.N, c.chunk, c.rounds, c.buckets));
    torch::manual_seed(c.N + 7 * c.chunk);
    auto q = torch::randn({2, 3, c.N, 6}, torch::kDouble).requires_grad_();
    auto v = torch::randn({2, 3, c.N, 6}, torch::kDouble).requires_grad_();
    auto rot = ops::lsh_rotations(3, c.rounds, 6, c.buckets, q.options());
    ops::LshOptions o;
    o.chunk = c.chunk;
    o.buckets = c.buckets;
    auto oracle = loop_lsh(q.detach(), v.detach(), rot, c.chunk, ops::lsh_factors(c.buckets));
    auto fast = ops::lsh_attention(q, v, rot, o), plain = ops::lsh_attention_reference(q, v, rot, o);
    EXPECT_LT(max_diff(fast, oracle), 1e-12);
    EXPECT_LT(max_diff(plain, oracle), 1e-12);

    auto w = torch::randn_like(fast);
    auto gf = torch::autograd::grad({(fast * w).sum()}, {q, v}), gp = torch::autograd::grad({(plain * w).sum()}, {q, v});
    for (size_t i = 0; i < 2; ++i) EXPECT_LT(max_diff(gf[i], gp[i]), 1e-11) << "gradient " << i;
  }
}

TEST(LshAttention, GradientsMatchFiniteDifferences) {
  torch::manual_seed(3);
  auto q = torch::randn({1, 2, 23, 4}, torch::kDouble).requires_grad_();
  auto v = torch::randn({1, 2, 23, 4}, torch::kDouble).requires_grad_();
  auto rot = ops::lsh_rotations(2, 2, 4, 4, q.options());
  auto w = torch::randn({1, 2, 23, 4}, torch::kDouble);
  ops::LshOptions o;
  o.chunk = 4;
  // Central differences of 1e-6 do not move a bucket here (the argmax margins are far larger).
  tu::expect_finite_differences([&] { return (ops::lsh_attention(q, v, rot, o) * w).sum(); }, {q, v});
}

// A position's output depends on earlier positions only: changing later queries (hence their buckets
// and the sorted places of everything after them) leaves it unchanged.
TEST(LshAttention, IsExactlyCausal) {
  torch::manual_seed(5);
  auto q = torch::randn({1, 2, 90, 8}, torch::kDouble), v = torch::randn({1, 2, 90, 8}, torch::kDouble);
  auto rot = ops::lsh_rotations(2, 3, 8, 8, q.options());
  ops::LshOptions o;
  o.chunk = 8;
  auto q2 = q.clone(), v2 = v.clone();
  q2.narrow(2, 50, 40).normal_();
  v2.narrow(2, 50, 40).normal_();
  auto a = ops::lsh_attention(q, v, rot, o), b = ops::lsh_attention(q2, v2, rot, o);
  // The same keys and weights; later positions may move them to other chunk slots, which changes only
  // the order of the sums (rounding, ~1e-16).
  EXPECT_LT(max_diff(a.narrow(2, 0, 50), b.narrow(2, 0, 50)), 1e-13);
  EXPECT_GT(max_diff(a.narrow(2, 50, 40), b.narrow(2, 50, 40)), 1e-3);
}

TEST(LshAttention, BucketsAreTheArgmaxOfTheRotation) {
  torch::manual_seed(6);
  auto q = torch::randn({2, 2, 30, 4}, torch::kDouble);
  auto rot = ops::lsh_rotations(2, 3, 4, 6, q.options());
  auto b = ops::lsh_buckets(q, rot);  // (B, K, R, N)
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t r = 0; r < 3; ++r) {
      auto x = torch::matmul(q.select(1, h), rot[h][r]);  // (B, N, 3)
      EXPECT_TRUE(torch::equal(b.select(1, h).select(1, r), torch::cat({x, -x}, -1).argmax(-1)));
    }
  EXPECT_NE(tu::error_of([&] { ops::lsh_rotations(2, 1, 4, 3, q.options()); }).find("even"), std::string::npos);
}

// Beyond 64 buckets the hash is factorised (b1 the even divisor nearest below sqrt(nb) leaving b2
// even); the bucket is the first factor's argmax times b2 plus the second's, over their own columns.
TEST(LshAttention, ManyBucketsAreFactorised) {
  EXPECT_EQ(ops::lsh_factors(8), std::vector<int64_t>({8}));
  EXPECT_EQ(ops::lsh_factors(64), std::vector<int64_t>({64}));
  EXPECT_EQ(ops::lsh_factors(72), std::vector<int64_t>({6, 12}));
  EXPECT_EQ(ops::lsh_factors(512), std::vector<int64_t>({16, 32}));
  EXPECT_EQ(ops::lsh_factors(130), std::vector<int64_t>({130}));  // 2 x 65: no two even factors
  torch::manual_seed(8);
  auto q = torch::randn({2, 2, 400, 4}, torch::kDouble);
  auto rot = ops::lsh_rotations(2, 3, 4, 72, q.options());  // 3 + 6 columns
  ASSERT_EQ(rot.size(3), 9);
  auto b = ops::lsh_buckets(q, rot, 72);  // (B, K, R, N)
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t r = 0; r < 3; ++r) {
      auto x = torch::matmul(q.select(1, h), rot[h][r]);  // (B, N, 9)
      auto hi = x.narrow(-1, 0, 3), lo = x.narrow(-1, 3, 6);
      auto expected = torch::cat({hi, -hi}, -1).argmax(-1) * 12 + torch::cat({lo, -lo}, -1).argmax(-1);
      EXPECT_TRUE(torch::equal(b.select(1, h).select(1, r), expected));
    }
  EXPECT_GE(b.min().item<int64_t>(), 0);
  EXPECT_LT(b.max().item<int64_t>(), 72);
  EXPECT_GT(std::get<0>(at::_unique(b)).numel(), 36);  // both digits vary: most of the 72 buckets are used
  EXPECT_NE(tu::error_of([&] { ops::lsh_buckets(q, rot, 64); }).find("columns"), std::string::npos);
}

// Reversible layers: the recomputing backward against autograd through the same composition, for
// dense, flash and lsh attention, with dropout (the recomputation must replay the forward's masks and
// rotations) and chunked feed-forward; loss, every parameter's gradient, and the random state after.
TEST(Reversible, RecomputingBackwardEqualsAutograd) {
  for (auto kind : {CausalKind::kDense, CausalKind::kFlash, CausalKind::kLsh}) {
    SCOPED_TRACE(attention::causal_kind_name(kind));
    auto config = tiny(kind, 40);
    config.model.reversible = true;
    config.model.ff_chunks = 3;
    config.model.dropout = 0.2;
    config.model.attn_dropout = 0.1;
    torch::manual_seed(2);
    models::GptModel model(config.model);
    model->to(torch::kDouble);
    model->train();
    auto x = torch::randint(11, {2, 40}, torch::kLong), y = torch::randint(11, {2, 40}, torch::kLong);
    auto run = [&](bool recompute) {
      model->recompute = recompute;
      model->zero_grad();
      torch::manual_seed(17);
      auto loss = torch::cross_entropy_loss(model->logits(model->forward(x)).reshape({-1, 11}), y.reshape({-1}));
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad().clone());
      return std::make_tuple(loss.item<double>(), grads, torch::rand({1}, torch::kDouble).item<double>());
    };
    auto [loss_a, grads_a, next_a] = run(true);
    auto [loss_b, grads_b, next_b] = run(false);
    EXPECT_LT(std::abs(loss_a - loss_b), 1e-12);
    for (size_t i = 0; i < grads_a.size(); ++i) EXPECT_LT(max_diff(grads_a[i], grads_b[i]), 1e-10) << "parameter " << i;
    EXPECT_EQ(next_a, next_b);  // backward leaves the random stream where the forward left it
  }
}

// Chunked feed-forward is the same function; a reversible model's KV-cache generation equals
// recomputation.
TEST(Reversible, ChunkedFeedForwardAndCachedGenerationAgree) {
  auto config = tiny(CausalKind::kDense, 24);
  config.model.reversible = true;
  torch::manual_seed(3);
  models::GptModel whole(config.model);
  config.model.ff_chunks = 5;
  models::GptModel chunked(config.model);
  {
    torch::NoGradGuard no_grad;
    auto source = whole->named_parameters();
    for (auto& p : chunked->named_parameters()) p.value().copy_(source[p.key()]);
  }
  whole->to(torch::kDouble), chunked->to(torch::kDouble);
  whole->eval(), chunked->eval();
  torch::NoGradGuard no_grad;
  auto x = torch::randint(11, {2, 24}, torch::kLong);
  EXPECT_LT(max_diff(whole->forward(x), chunked->forward(x)), 1e-12);
  models::GptDecoder recompute, cached;
  recompute.use_cache = false;
  auto tokens = torch::randint(11, {1, 40}, torch::kLong);
  EXPECT_LT(max_diff(whole->extend(tokens.narrow(1, 0, 8), recompute), whole->extend(tokens.narrow(1, 0, 8), cached)), 1e-12);
  for (int64_t i = 8; i < 40; ++i)
    EXPECT_LT(max_diff(whole->extend(tokens.narrow(1, i, 1), recompute), whole->extend(tokens.narrow(1, i, 1), cached)), 1e-12);
}

TEST(ReformerTraining, LshWithReversibleLayersLearnsAndResumesBitForBit) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 30000);
  GptConfig c = tiny(CausalKind::kLsh, 32);
  c.model.vocab_size = 0;
  c.model.d_model = 32;
  c.model.dropout = 0.1;
  c.model.reversible = true;
  c.model.ff_chunks = 2;
  c.train.data = tmp.path();
  c.train.batch_size = 8;
  c.train.nb_steps = 100;
  c.train.lr_warmup = 5;
  c.train.lr = 3e-3;
  c.train.eval_interval = 50;
  c.train.eval_blocks = 2;
  c.train.threads = 0;  // OMP_NUM_THREADS (one under scripts/test.sh), else every core
  auto full = tu::run_family(to_json(c), tmp.file("a"));
  EXPECT_LT(full.last_valid, 4.7) << "bits per byte after 100 steps";
  tu::run_family(to_json(c), tmp.file("b"), false, 37);
  tu::run_family(to_json(c), tmp.file("b"), true);
  tu::expect_same_checkpoint(tmp.file("a/checkpoint.pt"), tmp.file("b/checkpoint.pt"));
}
