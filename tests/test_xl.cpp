// Transformer-XL, adaptive softmax and the PAR super-network against plain double-precision loops.
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <cmath>
#include <fstream>

#include "spanformer/config/xl_config.h"
#include "spanformer/data/words.h"
#include "spanformer/models/par.h"
#include "spanformer/models/xl.h"
#include "spanformer/nn/adaptive_softmax.h"
#include "spanformer/nn/gumbel.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/runner.h"
#include "spanformer/train/xl.h"
#include "util.h"

namespace spanformer {
namespace {

using models::xl::XlModel;

XlModelConfig tiny_config() {
  XlModelConfig c;
  c.vocab_size = 50;
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 2;
  c.d_head = 8;
  c.d_inner = 24;
  c.dropout = 0.0;
  c.tgt_len = 6;
  c.mem_len = 6;
  c.init_std = 0.3;  // larger than the default so that every term matters in the comparisons
  return c;
}

XlModel double_model(const XlModelConfig& c) {
  torch::manual_seed(3);
  XlModel m(c);
  m->to(torch::kDouble);
  m->eval();
  return m;
}

TEST(XlRelShift, MatchesTheReferencePaddingOnEveryEntryAndTheDistanceOnUnmaskedOnes) {
  const int64_t Q = 5, R = 9, Mm = R - Q;
  auto x = torch::randn({2, 3, Q, R}, torch::kDouble);
  auto out = models::xl::rel_shift(x);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < Q; ++i)
        for (int64_t j = 0; j < R; ++j) {
          // The reference's pad-view-drop, written as flat-index arithmetic.
          const int64_t m = Q + i * R + j, row = m / (R + 1), col = m % (R + 1);
          const double expected = col == 0 ? 0.0 : x[a][h][row][col - 1].item<double>();
          EXPECT_EQ(out[a][h][i][j].item<double>(), expected) << i << "," << j;
          // Unmasked keys: the entry of distance Mm + i - j, i.e. r index Q - 1 - i + j.
          if (j <= Mm + i) EXPECT_EQ(out[a][h][i][j].item<double>(), x[a][h][i][j + Q - 1 - i].item<double>());
        }
}

TEST(XlAttention, EqualsTheFourTermDefinitionComputedByLoops) {
  auto c = tiny_config();
  c.untie_r = true;
  torch::manual_seed(5);
  models::xl::RelAttention attn(c);
  attn->to(torch::kDouble);
  attn->eval();
  const int64_t B = 2, M = 4, Mm = 3, Kl = Mm + M, K = c.n_head, D = c.d_head, H = c.d_model;
  auto h = torch::randn({B, M, H}, torch::kDouble), mem = torch::randn({B, Mm, H}, torch::kDouble);
  auto pos = torch::arange(Kl - 1, -1, -1.0, torch::kDouble);
  auto r = models::xl::sinusoid(pos, H);
  auto mask = models::xl::attention_mask(M, Mm, false, Mm, torch::kCPU);
  auto out = attn->forward(h, mem, r, {}, {}, mask);
  // Direct computation.
  torch::NoGradGuard no_grad;
  auto cat = torch::cat({mem, h}, 1);
  auto Wqkv = attn->qkv->weight, Wr = attn->r_net->weight, Wo = attn->o_net->weight;
  auto u = attn->r_w_bias, v = attn->r_r_bias;
  for (int64_t b = 0; b < B; ++b) {
    auto heads = torch::matmul(cat[b], Wqkv.t());  // (Kl, 3KD)
    std::vector<double> vec(K * D, 0.0);
    for (int64_t i = 0; i < M; ++i) {
      std::vector<double> attn_vec(K * D, 0.0);
      for (int64_t k = 0; k < K; ++k) {
        std::vector<double> score(Kl, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= Mm + i; ++j) {
          const double dist = static_cast<double>(Mm + i - j);
          // r for this distance, directly from the sinusoid formula.
          std::vector<double> rd(H);
          for (int64_t f = 0; f < H / 2; ++f) {
            const double freq = 1.0 / std::pow(10000.0, 2.0 * f / H);
            rd[f] = std::sin(dist * freq);
            rd[f + H / 2] = std::cos(dist * freq);
          }
          double s = 0;
          for (int64_t d = 0; d < D; ++d) {
            const double q = heads[Mm + i][k * D + d].item<double>();
            const double key = heads[j][K * D + k * D + d].item<double>();
            double rk = 0;
            for (int64_t e = 0; e < H; ++e) rk += Wr[k * D + d][e].item<double>() * rd[e];
            s += (q + u[k][d].item<double>()) * key + (q + v[k][d].item<double>()) * rk;
          }
          score[j] = s / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, score[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= Mm + i; ++j) z += std::exp(score[j] - mx);
        for (int64_t j = 0; j <= Mm + i; ++j) {
          const double p = std::exp(score[j] - mx) / z;
          for (int64_t d = 0; d < D; ++d) attn_vec[k * D + d] += p * heads[j][2 * K * D + k * D + d].item<double>();
        }
      }
      auto av = torch::tensor(attn_vec, torch::kDouble);
      auto expected = torch::layer_norm(h[b][i] + torch::matmul(Wo, av), {H}, attn->norm->weight, attn->norm->bias, 1e-5);
      EXPECT_LT((out[b][i] - expected).abs().max().item<double>(), 1e-10) << b << "," << i;
    }
  }
}

TEST(XlMask, SameLengthGivesEveryQueryMemLenKeysAndNoFutureKey) {
  for (int64_t mlen : {0, 3, 6}) {
    const int64_t Q = 6, mem_len = 6;
    auto mask = models::xl::attention_mask(Q, mlen, true, mem_len, torch::kCPU);
    auto plain = models::xl::attention_mask(Q, mlen, false, mem_len, torch::kCPU);
    const int64_t klen = mlen + Q, mask_len = klen - mem_len, shift = mask_len > 0 ? Q - mask_len : Q;
    for (int64_t i = 0; i < Q; ++i) {
      int64_t visible = 0;
      for (int64_t j = 0; j < klen; ++j) {
        const bool expected = j > mlen + i || j <= i - shift;
        EXPECT_EQ(mask[i][j].item<bool>(), expected) << mlen << ":" << i << "," << j;
        EXPECT_EQ(plain[i][j].item<bool>(), j > mlen + i);
        visible += !expected;
      }
      if (mlen == mem_len) EXPECT_EQ(visible, mem_len);  // every query sees the same number of keys
    }
  }
}

TEST(XlModelTest, CausalWithinASegment) {
  auto c = tiny_config();
  auto model = double_model(c);
  auto x = torch::randint(c.vocab_size, {2, 6}, torch::kLong);
  auto mems = model->initial_mems(2);
  auto h1 = model->forward(x, mems, models::xl::Lengths::of(c));
  auto x2 = x.clone();
  x2.select(1, 4).fill_(7 + 1);
  x2[0][4] = (x[0][4].item<int64_t>() + 1) % c.vocab_size;
  x2[1][4] = (x[1][4].item<int64_t>() + 1) % c.vocab_size;
  auto mems2 = model->initial_mems(2);
  auto h2 = model->forward(x2, mems2, models::xl::Lengths::of(c));
  EXPECT_LT((h1.narrow(1, 0, 4) - h2.narrow(1, 0, 4)).abs().max().item<double>(), 1e-12);
  EXPECT_GT((h1.narrow(1, 4, 2) - h2.narrow(1, 4, 2)).abs().max().item<double>(), 1e-6);
}

// Two segments with memory = one sequence, for plain, pre-norm, PAR-style and untied models.
TEST(XlModelTest, TwoSegmentsWithMemoryEqualOnePass) {
  for (const std::string layers : {"af", "afaf", "aaff", "faf"}) {
    for (bool pre : {false, true}) {
      auto c = tiny_config();
      c.layers = layers;
      c.pre_lnorm = pre;
      c.untie_r = layers == "aaff";
      c.mem_len = 6;
      auto model = double_model(c);
      auto x = torch::randint(c.vocab_size, {2, 12}, torch::kLong);
      auto lengths = models::xl::Lengths::of(c);
      auto mems = model->initial_mems(2);
      auto a = model->forward(x.narrow(1, 0, 6), mems, lengths);
      auto b = model->forward(x.narrow(1, 6, 6), mems, lengths);
      auto one_mems = model->initial_mems(2);
      auto whole = model->forward(x, one_mems, lengths);
      EXPECT_LT((torch::cat({a, b}, 1) - whole).abs().max().item<double>(), 1e-10) << layers << " pre " << pre;
      EXPECT_EQ(mems[layers.find('a')].size(1), 6);
    }
  }
}

TEST(XlModelTest, ClampLenOnlyActsOnDistancesAboveIt) {
  auto c = tiny_config();
  auto model = double_model(c);
  auto x = torch::randint(c.vocab_size, {2, 6}, torch::kLong);
  auto run = [&](int64_t clamp) {
    auto mems = model->initial_mems(2);
    return model->forward(x, mems, models::xl::Lengths{6, 0, clamp, false});
  };
  auto none = run(0), above = run(5), low = run(2);
  EXPECT_LT((none - above).abs().max().item<double>(), 1e-14);  // largest distance in 6 tokens is 5
  // With clamp 2, queries 0..2 see distances <= 2 only: unchanged; later queries see clamped vectors.
  EXPECT_LT((none.narrow(1, 0, 3) - low.narrow(1, 0, 3)).abs().max().item<double>(), 1e-14);
  EXPECT_GT((none.narrow(1, 3, 3) - low.narrow(1, 3, 3)).abs().max().item<double>(), 1e-6);
}

TEST(XlModelTest, MemoryKeepsTheLastMemLenInputsAndExtLenIsNotKept) {
  auto c = tiny_config();
  auto model = double_model(c);
  auto x = torch::randint(c.vocab_size, {1, 6}, torch::kLong);
  models::xl::Lengths len{4, 2, 0, false};
  auto mems = model->initial_mems(1);
  model->forward(x, mems, len);
  // end = 0 + 6 - 2 = 4, begin = 0: the embedded inputs of positions 0..3.
  auto emb = model->word_emb(x);
  EXPECT_EQ(mems[0].size(1), 4);
  EXPECT_LT((mems[0] - emb.narrow(1, 0, 4)).abs().max().item<double>(), 1e-12);
}

TEST(XlModelTest, AdaptiveSpanAtFullSpanChangesNothingAndShortSpansCutDistantKeys) {
  auto c = tiny_config();
  c.adapt_span = true;
  c.attn_span = 100;
  c.adapt_span_ramp = 4;
  c.adapt_span_init = 1.0;
  c.layers = "af";  // one attention block: what a query sees is what its mask lets through
  auto with_span = double_model(c);
  auto c0 = c;
  c0.adapt_span = false;
  auto plain = double_model(c0);
  {
    torch::NoGradGuard g;
    for (auto& item : plain->named_parameters()) item.value().copy_(with_span->named_parameters()[item.key()]);
  }
  auto x = torch::randint(c.vocab_size, {2, 6}, torch::kLong);
  auto m1 = with_span->initial_mems(2), m2 = plain->initial_mems(2);
  auto a = with_span->forward(x, m1, models::xl::Lengths::of(c));
  auto b = plain->forward(x, m2, models::xl::Lengths::of(c));
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-7);  // the 1e-8 renormalisation term only
  // Span 0 with ramp 4: m(d) = (4 - d) / 4, zero from distance 4 on; changing token 0 leaves position 5
  // (distance 5) unchanged but changes position 3 (distance 3, weight 1/4). "Unchanged" up to the
  // reference's renormalisation a m / (sum a m + 1e-8), whose 1e-8 is relative to a softmax that still
  // counts the masked key: a change of order 1e-8.
  {
    torch::NoGradGuard g;
    for (auto& at : with_span->attn)
      if (at) at->span->span_ratio.fill_(0.0);
  }
  auto y = x.clone();
  y[0][0] = (x[0][0].item<int64_t>() + 1) % c.vocab_size;
  auto m3 = with_span->initial_mems(2), m4 = with_span->initial_mems(2);
  auto p = with_span->forward(x, m3, models::xl::Lengths::of(c));
  auto q = with_span->forward(y, m4, models::xl::Lengths::of(c));
  EXPECT_LT((p[0][5] - q[0][5]).abs().max().item<double>(), 1e-7);
  EXPECT_GT((p[0][3] - q[0][3]).abs().max().item<double>(), 1e-4);
}

TEST(AdaptiveSoftmax, OneClusterIsAFullSoftmax) {
  nn::AdaptiveOptions o;
  o.vocab_size = 30;
  o.d_embed = 8;
  o.d_proj = 8;
  torch::manual_seed(1);
  nn::AdaptiveEmbedding emb(o);
  nn::AdaptiveLogSoftmax crit(o, emb.get(), false, false);
  crit->to(torch::kDouble);
  auto h = torch::randn({10, 8}, torch::kDouble);
  auto t = torch::randint(30, {10}, torch::kLong);
  auto expected = torch::cross_entropy_loss(torch::addmm(crit->biases[0], h, crit->weights[0].t()), t,
                                            {}, at::Reduction::None);
  EXPECT_LT((crit->nll(h, t) - expected).abs().max().item<double>(), 1e-12);
}

TEST(AdaptiveSoftmax, LogProbabilitiesSumToOneAndMatchTheNll) {
  for (int64_t div_val : {1, 2}) {
    for (int64_t d_embed : {8, 12}) {
      nn::AdaptiveOptions o;
      o.vocab_size = 40;
      o.d_embed = d_embed;
      o.d_proj = 8;
      o.cutoffs = {10, 20, 30};
      o.div_val = div_val;
      o.init_std = 0.5;
      o.proj_init_std = 0.5;
      torch::manual_seed(2);
      nn::AdaptiveEmbedding emb(o);
      nn::AdaptiveLogSoftmax crit(o, emb.get(), true, true);
      emb->to(torch::kDouble);
      crit->to(torch::kDouble);
      auto h = torch::randn({16, 8}, torch::kDouble);
      auto lp = crit->log_prob(h);  // (16, 40)
      EXPECT_LT((lp.exp().sum(1) - 1).abs().max().item<double>(), 1e-12) << div_val << " " << d_embed;
      auto t = torch::arange(0, 40, 40 / 16 + 1, torch::kLong).narrow(0, 0, 14);
      auto hh = h.narrow(0, 0, 14);
      auto nll = crit->nll(hh, t);
      EXPECT_LT((nll + lp.narrow(0, 0, 14).gather(1, t.unsqueeze(1)).squeeze(1)).abs().max().item<double>(), 1e-12);
      // Tied tensors are the embedding's and are registered once.
      EXPECT_TRUE(crit->weights[0].is_same(emb->tables[0]));
      for (auto& p : crit->named_parameters()) EXPECT_EQ(p.key().find("weight_"), std::string::npos) << p.key();
    }
  }
}

TEST(AdaptiveSoftmax, TheHeadHoldsClusterLogitsInReverseOrder) {
  // The reference reads cluster i's logit at head column -i. Raise the LAST cluster row's bias: that is
  // cluster 1 (ids 10..19), whose probabilities must go up.
  nn::AdaptiveOptions o;
  o.vocab_size = 30;
  o.d_embed = 8;
  o.d_proj = 8;
  o.cutoffs = {10, 20};
  torch::manual_seed(4);
  nn::AdaptiveEmbedding emb(o);
  nn::AdaptiveLogSoftmax crit(o, emb.get(), false, false);
  auto h = torch::randn({1, 8});
  torch::NoGradGuard g;
  auto before = crit->log_prob(h);
  crit->cluster_bias[1] += 3.0;
  auto after = crit->log_prob(h);
  EXPECT_GT((after - before).slice(1, 10, 20).min().item<double>(), 1.0);
  EXPECT_LT((after - before).slice(1, 20, 30).max().item<double>(), 0.0);
}

TEST(AdaptiveEmbeddingTest, EqualsTheClusterTableLookupProjectedAndScaled) {
  nn::AdaptiveOptions o;
  o.vocab_size = 40;
  o.d_embed = 8;
  o.d_proj = 6;
  o.cutoffs = {10, 25};
  o.div_val = 2;
  torch::manual_seed(7);
  nn::AdaptiveEmbedding emb(o);
  emb->to(torch::kDouble);
  auto x = torch::tensor({0L, 9L, 10L, 24L, 25L, 39L}).view({2, 3});
  auto e = emb->forward(x);  // (2, 3, 6)
  const int64_t bounds[] = {0, 10, 25, 40};
  for (int64_t n = 0; n < 6; ++n) {
    const int64_t id = x.view({-1})[n].item<int64_t>();
    int64_t c = 0;
    while (id >= bounds[c + 1]) ++c;
    auto expected = torch::matmul(emb->projs[c], emb->tables[c][id - bounds[c]]) * std::sqrt(6.0);
    EXPECT_LT((e.view({6, 6})[n] - expected).abs().max().item<double>(), 1e-12);
  }
}

TEST(AdaptiveSoftmax, ProposedCutoffsCoverTheAskedShares) {
  std::vector<int64_t> counts = {50, 20, 10, 8, 5, 4, 2, 1};  // 100 tokens
  auto c = nn::propose_cutoffs(counts, {0.5, 0.8, 0.95}, 1);
  EXPECT_EQ(c, (std::vector<int64_t>{1, 3, 6}));  // 50% after 1 id, 80% after 3, 97% after 6
  EXPECT_NE(tu::error_of([&] { nn::propose_cutoffs(counts, {0.9, 0.5}, 1); }).find("increase"), std::string::npos);
}

TEST(Gumbel, HardSampleFrequenciesFollowSoftmaxAlpha) {
  torch::manual_seed(11);
  auto alpha = torch::tensor({1.0, 0.0, -1.0}, torch::kDouble);
  const int64_t n = 20000;
  auto logits = alpha.unsqueeze(0).expand({n, 3}).contiguous();
  auto y = nn::gumbel_softmax(logits, 1.0, true);
  auto freq = y.sum(0) / static_cast<double>(n);
  auto p = torch::softmax(alpha, 0);
  for (int k = 0; k < 3; ++k) {
    const double pk = p[k].item<double>(), sigma = std::sqrt(pk * (1 - pk) / n);
    EXPECT_NEAR(freq[k].item<double>(), pk, 5 * sigma) << k;
  }
  // Hard samples are one-hot; soft ones are distributions.
  EXPECT_TRUE(((y == 0) | (y == 1)).all().item<bool>());
  EXPECT_TRUE((y.sum(1) == 1).all().item<bool>());
  auto soft = nn::gumbel_softmax(logits.narrow(0, 0, 100), 0.5, false);
  EXPECT_LT((soft.sum(1) - 1).abs().max().item<double>(), 1e-12);
  EXPECT_GE(soft.min().item<double>(), 0.0);
}

TEST(Gumbel, GradientsStayFiniteAtSmallTemperature) {
  torch::manual_seed(12);
  for (double tau : {1.0, 1e-2, 1e-4}) {
    for (bool hard : {false, true}) {
      auto alpha = torch::randn({64, 3}, torch::requires_grad());
      auto w = nn::gumbel_softmax(alpha, tau, hard);
      (w * torch::arange(3.0)).sum().backward();
      EXPECT_TRUE(torch::isfinite(alpha.grad()).all().item<bool>()) << tau << " " << hard;
      EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
    }
  }
  EXPECT_NE(tu::error_of([] { nn::gumbel_softmax(torch::zeros({1, 3}), 0.0, false); }).find("positive"), std::string::npos);
}

TEST(ParSuperNetwork, StronglyFavouredTypesReproduceThePlainModel) {
  auto plain_c = tiny_config();
  plain_c.layers = "afaf";
  auto plain = double_model(plain_c);
  auto super_c = tiny_config();
  super_c.search = true;  // 2 x 2 = 4 blocks
  for (const SearchEval mode : {SearchEval::kArgmax, SearchEval::kSoftmax}) {
    super_c.search_eval = mode;
    auto net = double_model(super_c);
    torch::NoGradGuard g;
    auto sp = net->named_parameters(), pp = plain->named_parameters();
    for (auto& item : pp) sp[item.key()].copy_(item.value());  // attn_0, ff_1, attn_2, ff_3, embeddings, u, v
    net->alpha.zero_();
    for (int64_t b = 0; b < 4; ++b) net->alpha[b][b % 2 == 0 ? 0 : 1] = 40.0;  // softmax weight 1 - 8e-18
    auto x = torch::randint(plain_c.vocab_size, {2, 6}, torch::kLong);
    auto m1 = plain->initial_mems(2), m2 = net->initial_mems(2);
    auto a = plain->forward(x, m1, models::xl::Lengths::of(plain_c));
    auto b = net->forward(x, m2, models::xl::Lengths::of(super_c), net->eval_weights());
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-12) << search_eval_name(mode);
  }
}

TEST(ParDerive, RulesOnFixedProbabilities) {
  models::par::BlockProbs p = {
      {0.6, 0.3, 0.1}, {0.2, 0.7, 0.1}, {0.5, 0.4, 0.1}, {0.1, 0.2, 0.7},  // blocks 0-3
      {0.45, 0.5, 0.05}, {0.3, 0.6, 0.1}, {0.9, 0.05, 0.05}, {0.2, 0.3, 0.5},  // blocks 4-7 (6 is in the top third)
      {0.1, 0.8, 0.1}};
  EXPECT_EQ(models::par::derive_argmax(p), "afaffaf");
  // par: identity blocks 3 and 7 dropped, T = 7 kept; ratio 3 -> round(7 / 3) = 2 attention blocks among
  // the kept blocks of the lower two thirds (index < 6): the highest P(a) there are blocks 0 (0.6) and 2 (0.5).
  EXPECT_EQ(models::par::derive_par(p, 3.0), "afaffff");
  // ratio 7 -> one attention block; ratio 1 -> every lower-two-thirds kept block (0, 1, 2, 4, 5).
  EXPECT_EQ(models::par::derive_par(p, 7.0), "affffff");
  EXPECT_EQ(models::par::derive_par(p, 1.0), "aaaaaff");
  EXPECT_NE(tu::error_of([&] { models::par::derive_par(p, 0.5); }).find("ratio"), std::string::npos);
  models::par::BlockProbs all_identity = {{0.1, 0.1, 0.8}};
  EXPECT_NE(tu::error_of([&] { models::par::derive_argmax(all_identity); }).find("identity"), std::string::npos);
}

TEST(XlConfigTest, BadValuesGiveClearErrors) {
  XlConfig c;
  c.model.vocab_size = 100;
  c.model.layers = "afxa";
  EXPECT_NE(tu::error_of([&] { validate(c); }).find("unknown block 'x' at position 2"), std::string::npos);
  c.model.layers = "";
  c.model.adaptive = true;
  c.model.cutoffs = {20, 10};
  EXPECT_NE(tu::error_of([&] { validate(c); }).find("strictly increasing"), std::string::npos);
  c.model.cutoffs = {20, 100};
  EXPECT_NE(tu::error_of([&] { validate(c); }).find("out of range"), std::string::npos);
  c.model.cutoffs = {20, 50};
  EXPECT_EQ(tu::error_of([&] { validate(c); }), "");
  c.model.search = true;
  c.search.tau1 = 0;
  EXPECT_NE(tu::error_of([&] { validate(c); }).find("tau"), std::string::npos);
  c.search.tau1 = 0.1;
  EXPECT_NE(tu::error_of([&] { apply_overrides(c, {"--search_eval=sample"}); }).find("search_eval"), std::string::npos);
  // JSON: unknown keys and a missing arch are refused; overrides reach every section.
  EXPECT_NE(tu::error_of([] { xl_config_from_json(nlohmann::json{{"arch", "xl"}, {"model", {{"n_layers", 3}}}}, "t"); })
                .find("unknown config key 'model.n_layers'"),
            std::string::npos);
  EXPECT_NE(tu::error_of([] { xl_config_from_json(nlohmann::json{{"model", nlohmann::json::object()}}, "t"); }).find("arch"),
            std::string::npos);
  XlConfig d;
  apply_overrides(d, {"--layers=afff", "--tau1=0.05", "--eval_mem_len=640", "--cutoffs=[10,20]"});
  EXPECT_EQ(d.model.layers, "afff");
  EXPECT_EQ(d.search.tau1, 0.05);
  EXPECT_EQ(d.model.eval_mem_len, 640);
  EXPECT_EQ(d.model.cutoffs, (std::vector<int64_t>{10, 20}));
}

TEST(XlSchedules, LearningRateAndTemperature) {
  TrainConfig t = xl_train_defaults();  // cosine
  t.lr = 1e-3;
  t.lr_min = 1e-5;
  t.lr_warmup = 10;
  t.nb_steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(t, 1), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1e-3);
  EXPECT_NEAR(learning_rate(t, 55), 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-15);
  EXPECT_NEAR(learning_rate(t, 110), 1e-5, 1e-15);
  XlSearchConfig s;
  EXPECT_DOUBLE_EQ(train::xl::temperature(s, 0, 100), 1.0);
  EXPECT_NEAR(train::xl::temperature(s, 50, 100), std::sqrt(0.1), 1e-12);
  EXPECT_NEAR(train::xl::temperature(s, 100, 100), 0.1, 1e-12);
  s.tau_schedule = TauSchedule::kLinear;
  EXPECT_NEAR(train::xl::temperature(s, 50, 100), 0.55, 1e-12);
}

// A small word corpus: "<eos>" per line, counts and ties as the reference's Vocab.
std::string write_text(const tu::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.file(name)) << text;
  return dir.file(name);
}

TEST(Words, VocabularyOrderUnknownWordsAndTokenFiles) {
  tu::TempDir dir;
  data::WordPrepareOptions o;
  o.train = write_text(dir, "train", "b a c a\n\n c b a d\n");
  o.valid = write_text(dir, "valid", "a z\n");
  o.test = write_text(dir, "test", "q\n");
  auto s = data::prepare_words(o, dir.file("out"));
  auto vocab = data::read_word_vocab(dir.file("out/words.txt"));
  // <eos> first, then by count (a 3, b 2, c 2: b before c by first appearance, d 1), <unk> added last.
  EXPECT_EQ(vocab.tokens, (std::vector<std::string>{"<eos>", "a", "b", "c", "d", "<unk>"}));
  EXPECT_EQ(s.train_tokens, 11);  // 8 words + 3 line ends
  EXPECT_EQ(s.valid_unk, 1);
  EXPECT_EQ(s.test_unk, 1);
  data::TokenFile train(dir.file("out/train.bin"));
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < train.size(); ++i) ids.push_back(train.at(i));
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 1, 3, 1, 0, 0, 3, 2, 1, 4, 0}));
  EXPECT_EQ(data::read_word_counts(dir.file("out")), (std::vector<int64_t>{3, 3, 2, 2, 1, 0}));
  auto corpus = data::load_corpus(dir.file("out"));
  EXPECT_TRUE(corpus.vocab.word_level);
  EXPECT_EQ(corpus.vocab.decode(1), "a ");
  o.vocab_from_all = true;
  data::prepare_words(o, dir.file("all"));
  auto all = data::read_word_vocab(dir.file("all/words.txt"));
  EXPECT_EQ(all.tokens.size(), 8u);  // + z, q (and <unk> still added)
  o.test = write_text(dir, "empty", "");
  EXPECT_NE(tu::error_of([&] { data::prepare_words(o, dir.file("bad")); }).find("empty"), std::string::npos);
}

// The segment-by-segment evaluation with enough memory equals one pass over each stream.
TEST(XlEvaluate, SegmentsWithFullMemoryEqualOnePassAndEveryTargetIsScoredOnce) {
  tu::TempDir dir;
  std::vector<int64_t> ids(83);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + i / 5) % 50);
  data::write_tokens(dir.file("t.bin"), ids, 50);
  data::TokenFile tokens(dir.file("t.bin"));
  auto c = tiny_config();
  auto model = double_model(c);
  train::xl::EvalOptions o;
  o.batch = 2;
  o.tgt_len = 7;
  o.lengths = {100, 0, 0, false};
  auto r = train::xl::evaluate(model, tokens, o);
  const int64_t S = 83 / 2;
  EXPECT_EQ(r.tokens, 2 * (S - 1));
  EXPECT_EQ(r.segments, (S - 1 + 6) / 7);
  // One pass.
  torch::NoGradGuard g;
  model->eval();
  auto all = torch::tensor(ids).narrow(0, 0, 2 * S).view({2, S});
  auto mems = model->initial_mems(2);
  auto h = model->forward(all.narrow(1, 0, S - 1), mems, o.lengths);
  const double direct = model->nll(h, all.narrow(1, 1, S - 1)).sum().item<double>();
  EXPECT_NEAR(r.nll_sum, direct, 1e-9 * std::abs(direct));
}

XlConfig run_config(const std::string& data, bool search) {
  XlConfig c;
  c.model = tiny_config();
  c.model.vocab_size = 0;
  c.model.dropout = 0.1;
  c.model.search = search;
  c.model.adaptive = true;
  c.model.cutoffs = {4, 7};
  c.model.div_val = 2;
  c.search.arch_freeze_steps = 2;
  c.train.data = data;
  c.train.batch_size = 4;
  c.train.batch_split = 2;
  c.train.nb_steps = 8;
  c.train.eval_interval = 4;
  c.train.eval_blocks = 3;
  c.train.lr = 3e-3;
  c.train.lr_warmup = 2;
  c.train.threads = 1;
  return c;
}

TEST(XlTraining, ResumedRunContinuesBitForBitAndTheLossFalls) {
  tu::TempDir dir;
  data::WordPrepareOptions o;
  std::string text;
  for (int i = 0; i < 60; ++i) text += "the cat sat on the mat and the dog sat on the log\n";
  o.train = write_text(dir, "train", text);
  o.valid = write_text(dir, "valid", text.substr(0, 400));
  o.test = o.valid;
  data::prepare_words(o, dir.file("data"));
  auto run = [](const XlConfig& c, const std::string& out, bool resume, int64_t stop_after) {
    auto family = train::family_from_json(to_json(c), "test config");
    train::RunOptions o;
    o.out_dir = out;
    o.resume = resume;
    o.progress = false;
    o.stop_after = stop_after;
    return train::run_training(*family, o);
  };
  for (bool search : {false, true}) {
    auto c = run_config(dir.file("data"), search);
    const std::string a_dir = dir.file(search ? "s1" : "p1"), b_dir = dir.file(search ? "s2" : "p2");
    auto r1 = run(c, a_dir, false, -1);
    run(c, b_dir, false, 3);  // stop inside an interval, away from a checkpoint boundary
    auto r2 = run(c, b_dir, true, -1);
    EXPECT_EQ(r2.steps, 8);
    EXPECT_EQ(r1.unit, "ppl");
    // Every weight, optimizer state (both optimizers of a super-network), memory and the generator.
    train::Checkpoint a(a_dir + "/checkpoint.pt"), b(b_dir + "/checkpoint.pt");
    EXPECT_EQ(a.family(), "xl");
    const auto ja = nlohmann::json::parse(a.text("manifest")), jb = nlohmann::json::parse(b.text("manifest"));
    for (const auto& [key, digest] : ja.items())
      if (key != "state.elapsed_seconds") EXPECT_EQ(digest, jb[key]) << key << " search " << search;
    EXPECT_EQ(r1.last_valid, r2.last_valid);
    // A periodic text: the validation perplexity after 8 steps is far below the vocabulary size (11).
    EXPECT_LT(r1.last_valid, 8.0) << search;
    if (search) {
      auto p = torch::softmax(a.tensor("model.alpha"), -1);
      EXPECT_GT((p - 1.0 / 3).abs().max().item<double>(), 1e-4);  // alpha moved after the frozen steps
    }
  }
  // An XL checkpoint does not load into an adaptive-span model, with a clear message.
  train::Checkpoint xl_checkpoint(dir.file("p1/checkpoint.pt"));
  auto as_family = train::family_from_json(nlohmann::json{{"model", {{"vocab_size", 11}}}}, "test");
  as_family->build();
  EXPECT_NE(tu::error_of([&] { as_family->load_weights(xl_checkpoint); }).find("is a xl model, not adaptive-span"),
            std::string::npos);
}

}  // namespace
}  // namespace spanformer
