// Adaptive input/softmax, Gumbel-softmax and the PAR super-network and its derivation rules.
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
#include "train/families/xl/protocol.h"
#include "util.h"
#include "xl_util.h"

namespace spanformer {
namespace {

using models::xl::XlModel;
using xl_test::double_model;
using xl_test::tiny_config;

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

}  // namespace
}  // namespace spanformer
