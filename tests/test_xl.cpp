// Transformer-XL attention and model: relative shift, the four-term attention, masks, memory, clamp, spans.
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

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

// The attention of one block against loops over its definition, in double precision. With adaptive
// span (z_k per head, ramp R): head k's softmax runs over the keys at distances 0 .. S_k - 1 with
// S_k = min(window, floor(z_k + R) + 1) (0 = the query itself), the probabilities are multiplied by
// m = clamp((R + z_k - d) / R, 0, 1) and renormalised with + 1e-8; the layer reads only the memory rows
// some head reaches (here 5 of 8).
void check_attention_against_loops(bool with_span, attention::AttnImpl impl = attention::AttnImpl::kAuto) {
  auto c = tiny_config();
  c.attn_impl = impl;
  c.untie_r = true;
  const double R = 2, L = 20;
  const std::vector<double> z = {1.5, 3.2};
  if (with_span) {
    c.adapt_span = true;
    c.attn_span = static_cast<int64_t>(L);
    c.adapt_span_ramp = static_cast<int64_t>(R);
  }
  torch::manual_seed(5);
  models::xl::RelAttention attn(models::xl::rel_attention_options(c));
  attn->to(torch::kDouble);
  attn->eval();
  if (with_span) {
    torch::NoGradGuard g;
    attn->span->span_ratio.copy_(torch::tensor({z[0] / L, z[1] / L}, torch::kDouble));
    attn->span->sync_host();
  }
  const int64_t B = 2, M = 4, Mm = with_span ? 8 : 3, Kl = Mm + M, K = c.n_head, D = c.d_head, H = c.d_model;
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
        auto visible = [&](int64_t j) {
          return j <= Mm + i && (!with_span || Mm + i - j < std::min<int64_t>(Kl, static_cast<int64_t>(std::floor(z[k] + R)) + 1));
        };
        auto m = [&](int64_t j) { return with_span ? std::clamp((R + z[k] - static_cast<double>(Mm + i - j)) / R, 0.0, 1.0) : 1.0; };
        for (int64_t j = 0; j < Kl; ++j) {
          if (!visible(j)) continue;
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
        double Z = 0, masked = 0;
        for (int64_t j = 0; j < Kl; ++j)
          if (visible(j)) Z += std::exp(score[j] - mx), masked += std::exp(score[j] - mx) * m(j);
        const double denominator = with_span ? masked / Z + 1e-8 : 1.0;
        for (int64_t j = 0; j < Kl; ++j) {
          if (!visible(j)) continue;
          const double p = std::exp(score[j] - mx) / Z * m(j) / denominator;
          for (int64_t d = 0; d < D; ++d) attn_vec[k * D + d] += p * heads[j][2 * K * D + k * D + d].item<double>();
        }
      }
      auto av = torch::tensor(attn_vec, torch::kDouble);
      auto expected = torch::layer_norm(h[b][i] + torch::matmul(Wo, av), {H}, attn->norm->weight, attn->norm->bias, 1e-5);
      EXPECT_LT((out[b][i] - expected).abs().max().item<double>(), 1e-10) << b << "," << i << " span " << with_span << " " << attention::attn_impl_name(impl);
    }
  }
}

TEST(XlAttention, EqualsTheFourTermDefinitionComputedByLoops) { check_attention_against_loops(false); }
TEST(XlAttention, AdaptiveSpanEqualsLoopsOverEachHeadsWindow) {
  check_attention_against_loops(true, attention::AttnImpl::kPlain);  // one masked product
  check_attention_against_loops(true, attention::AttnImpl::kFused);  // per-head windows
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

// kimiyoung/transformer-xl: new_mems = self._update_mems(hids, mems, mlen, qlen) into
// def _update_mems(self, hids, mems, qlen, mlen): end_idx = mlen + max(0, qlen - ext_len), so the memory
// ends at Q + max(0, Mm - ext_len) of [mem; h] and starts mem_len before.
TEST(XlModelTest, MemoryFollowsTheReferenceUpdateWithExtLen) {
  auto c = tiny_config();
  auto model = double_model(c);
  model->eval();
  models::xl::Lengths len{4, 2, 0, false};
  auto mems = model->initial_mems(1);
  auto x1 = torch::randint(c.vocab_size, {1, 6}, torch::kLong), x2 = torch::randint(c.vocab_size, {1, 6}, torch::kLong);
  model->forward(x1, mems, len);
  // Segment 1: Mm = 0, Q = 6: end = 6, begin = 2: the embedded inputs of positions 2..5.
  auto e1 = model->word_emb(x1), e2 = model->word_emb(x2);
  ASSERT_EQ(mems[0].size(1), 4);
  EXPECT_LT((mems[0] - e1.narrow(1, 2, 4)).abs().max().item<double>(), 1e-12);
  // Segment 2: Mm = 4: end = 6 + 2 = 8, begin = 4 of [mem (4); inputs (6)]: inputs 0..3 (the last
  // ext_len = 2 inputs are re-read by the next segment, not kept).
  model->forward(x2, mems, len);
  ASSERT_EQ(mems[0].size(1), 4);
  EXPECT_LT((mems[0] - e2.narrow(1, 0, 4)).abs().max().item<double>(), 1e-12);
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
  EXPECT_EQ((p[0][5] - q[0][5]).abs().max().item<double>(), 0.0);  // beyond every head's window
  EXPECT_GT((p[0][3] - q[0][3]).abs().max().item<double>(), 1e-4);
}

// Compute and memory follow the spans: with short spans each block keeps only cache_size() states of
// its memory (here 136 of mem_len 150) and reads only the rows its heads reach, and five segments with
// these memories give what one pass over the whole sequence gives (every key a head visits is there).
TEST(XlModelTest, AdaptiveSpanTrimsMemoriesAndSegmentsStillEqualOnePass) {
 for (auto impl : {attention::AttnImpl::kPlain, attention::AttnImpl::kFused}) {
  auto c = tiny_config();
  c.attn_impl = impl;
  c.adapt_span = true;
  c.attn_span = 200;
  c.adapt_span_ramp = 4;
  c.mem_len = 150;
  c.tgt_len = 40;
  auto model = double_model(c);
  {
    torch::NoGradGuard g;
    for (auto& a : model->attn)
      if (a) a->span->span_ratio.copy_(torch::tensor({10.0 / 200, 60.0 / 200}, torch::kDouble));
  }
  auto x = torch::randint(c.vocab_size, {2, 200}, torch::kLong);
  auto lengths = models::xl::Lengths::of(c);
  auto mems = model->initial_mems(2);
  std::vector<torch::Tensor> parts;
  for (int64_t s = 0; s < 5; ++s) parts.push_back(model->forward(x.narrow(1, 40 * s, 40), mems, lengths));
  for (size_t b = 0; b < mems.size(); ++b)
    if (model->blocks()[b] == BlockKind::kAttention) EXPECT_EQ(mems[b].size(1), 136) << b;  // min(L, L - 128 + 64)
  auto whole_lengths = lengths;
  whole_lengths.mem_len = 0;
  auto one = model->initial_mems(2);
  auto whole = model->forward(x, one, whole_lengths);
  EXPECT_LT((torch::cat(parts, 1) - whole).abs().max().item<double>(), 1e-10) << attention::attn_impl_name(impl);
 }
}

// Per-head windows and the one masked product are the same function: outputs and every gradient
// (span ratios included) agree in double precision over two segments with carried memories.
TEST(XlModelTest, AdaptiveSpanPerHeadWindowsGiveThePlainPathsGradients) {
  std::map<std::string, torch::Tensor> grads[2];
  torch::Tensor outs[2];
  auto x = torch::randint(50, {2, 24}, torch::kLong), y = torch::randint(50, {2, 24}, torch::kLong);
  int n = 0;
  for (auto impl : {attention::AttnImpl::kPlain, attention::AttnImpl::kFused}) {
    auto c = tiny_config();
    c.adapt_span = true;
    c.attn_span = 30;
    c.adapt_span_ramp = 3;
    c.mem_len = 20;
    c.attn_impl = impl;
    auto model = double_model(c);
    model->train();  // dropout is 0: deterministic
    {
      torch::NoGradGuard g;
      for (auto& a : model->attn)
        if (a) a->span->span_ratio.copy_(torch::tensor({2.5 / 30, 11.0 / 30}, torch::kDouble));
    }
    auto mems = model->initial_mems(2);
    auto lengths = models::xl::Lengths::of(c);
    torch::Tensor loss = torch::zeros({}, torch::kDouble);
    std::vector<torch::Tensor> hs;
    for (int64_t s = 0; s < 2; ++s) {
      auto h = model->forward(x.narrow(1, 12 * s, 12), mems, lengths);
      hs.push_back(h);
      loss = loss + model->nll(h, y.narrow(1, 12 * s, 12)).mean();
    }
    (loss + model->span_loss()).backward();
    outs[n] = torch::cat(hs, 1).detach();
    for (auto& item : model->named_parameters())
      if (item.value().grad().defined()) grads[n][item.key()] = item.value().grad().clone();
    ++n;
  }
  EXPECT_LT((outs[0] - outs[1]).abs().max().item<double>(), 1e-12);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (auto& [name, g] : grads[0]) {
    EXPECT_LT((g - grads[1][name]).abs().max().item<double>(), 1e-12) << name;
    if (name.find("span_ratio") != std::string::npos) EXPECT_GT(g.abs().max().item<double>(), 0.0) << name;
  }
}

}  // namespace
}  // namespace spanformer
