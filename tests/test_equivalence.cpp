// Every attention implementation gives the reference's result at the level users see: whole
// models over several blocks with carried caches, in double precision, fused vs plain (and auto, which
// picks one of them per layer), over the span layouts trained models reach:
//   trimmed     every span far below L, so the layer reads only its last L' = L - trim_len keys;
//   one_long    one head long, the others ~0 (the fused path then projects values per head);
//   zero        every span exactly 0 (where every run starts);
//   at_L        every span at L (no trimming, one value product);
//   grown       spans that grew after the cache was sized, so the cache is shorter than L';
// with B 1 and B 3, eval and train mode, and persistent memory. Compared: logits, losses, every
// gradient and the carried caches. Then the one-token decode path of `generate` against block processing.
//
// Tolerances: both paths run the same double-precision arithmetic in different orders, so they agree to
// ~1e-14 relative; 1e-10 leaves room for the sums over hundreds of keys and still catches the smallest
// semantic difference that matters: the 1e-8 Z term of the softmax normaliser (once left out of the fused op) changes
// outputs by ~1e-8 relative even in these random models, and by O(1) in trained ones.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <string>
#include <vector>

#include "spanformer/models/transformer_seq.h"
#include "spanformer/ops/adaptive_span_attention.h"

using namespace spanformer;
using attention::AttnImpl;

namespace {

struct Layout {
  const char* name;
  std::vector<double> z;        // per head, tokens (layer 1 uses them reversed)
  std::vector<double> z_grown;  // spans set before the second block (empty: unchanged)
  bool per_head_values;         // whether the fused path projects values per head in the first block
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"trimmed", {3.0, 10.5, 20.25, 7.0}, {}, false},             // L' = 60
      {"one_long", {600.5, 0.01, 0.0, 0.2}, {}, true},             // L' = 636, 3 heads read 9 keys
      {"zero", {0.0, 0.0, 0.0, 0.0}, {}, false},                   // L' = 60
      {"at_L", {700.0, 700.0, 700.0, 700.0}, {}, false},           // L' = 700
      {"grown", {5.0, 5.0, 2.5, 5.0}, {600.5, 3.0, 1.0, 2.0}, false},  // L' 60 -> 636, cache 124
  };
  return all;
}

ModelConfig model_config(int64_t pers_mem_size) {
  ModelConfig c;
  c.vocab_size = 11;
  c.nb_layers = 2;
  c.hidden_size = 16;  // K 4 x D 4
  c.inner_hidden_size = 32;
  c.nb_heads = 4;
  c.attn_span = 700;   // L: long enough for per-head value projections (windows of 512 and more)
  c.block_size = 24;   // M
  c.dropout = 0.0;     // train mode without dropout: the paths draw masks from different streams
  c.adapt_span_ramp = 8;
  c.adapt_span_loss = 1e-3;  // a span loss large enough to matter in the span gradients
  c.pers_mem_size = pers_mem_size;
  return c;
}

void set_spans(models::TransformerSeq& model, const std::vector<double>& z) {
  torch::NoGradGuard no_grad;
  const double L = static_cast<double>(model->config().attn_span);
  for (size_t l = 0; l < model->layers.size(); ++l) {
    auto& ratio = model->layers[l]->attn->span->span_ratio;
    for (int64_t h = 0; h < ratio.size(0); ++h) {
      const size_t i = l % 2 == 0 ? static_cast<size_t>(h) : z.size() - 1 - static_cast<size_t>(h);
      ratio[h] = z[i] / L;
    }
  }
  model->sync_spans();
}

// What a run over three blocks produces: per-block logits and losses, then every gradient and cache.
struct BlockRun {
  std::vector<torch::Tensor> logits, grads, caches;
  std::vector<double> losses;
  std::vector<bool> fused_layers, per_head_layers;  // which path each layer took in the first block
};

BlockRun run_blocks(AttnImpl impl, const Layout& layout, int64_t B, bool train, int64_t pers) {
  auto config = model_config(pers);
  config.attn_impl = impl;
  torch::manual_seed(5);
  models::TransformerSeq model(config);
  model->to(torch::kDouble);
  train ? model->train() : model->eval();
  set_spans(model, layout.z);
  const int64_t M = config.block_size;
  torch::manual_seed(6);
  auto ids = torch::randint(config.vocab_size, {B, 3 * M + 1}, torch::kLong);  // (B, 3M+1)
  auto caches = model->initial_caches(B);
  BlockRun run;
  for (const auto& layer : model->layers) {
    run.fused_layers.push_back(layer->attn->uses_fused_op(B, M));
    run.per_head_layers.push_back(layer->attn->uses_per_head_values(B, M));
  }
  for (int64_t b = 0; b < 3; ++b) {
    if (b == 1 && !layout.z_grown.empty()) set_spans(model, layout.z_grown);
    auto x = ids.narrow(1, b * M, M), y = ids.narrow(1, b * M + 1, M);                // (B, M)
    auto logits = model->logits(model->forward(x, caches));                            // (B, M, V)
    auto loss = torch::nll_loss(torch::log_softmax(logits, -1).view({B * M, -1}), y.reshape({-1})) + model->span_loss();
    loss.backward();
    run.logits.push_back(logits.detach());
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& p : model->parameters()) run.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  run.caches = caches;
  return run;
}

double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a - b).abs().max().item<double>() / scale;
}

void expect_same(const BlockRun& got, const BlockRun& want, const std::string& what) {
  for (size_t b = 0; b < want.logits.size(); ++b) {
    EXPECT_LT(max_rel_diff(got.logits[b], want.logits[b]), 1e-10) << what << " logits of block " << b;
    EXPECT_NEAR(got.losses[b], want.losses[b], 1e-12) << what << " loss of block " << b;
  }
  for (size_t i = 0; i < want.grads.size(); ++i)
    EXPECT_LT(max_rel_diff(got.grads[i], want.grads[i]), 1e-10) << what << " gradient of parameter " << i;
  for (size_t l = 0; l < want.caches.size(); ++l) {
    ASSERT_EQ(got.caches[l].sizes(), want.caches[l].sizes()) << what << " cache " << l;
    EXPECT_LT(max_rel_diff(got.caches[l], want.caches[l]), 1e-10) << what << " cache " << l;
  }
}

struct GridCase {
  size_t layout;
  int64_t B;
  bool train;
  int64_t pers;
};

std::string case_name(const GridCase& c) {
  return std::string(layouts()[c.layout].name) + "_B" + std::to_string(c.B) + (c.train ? "_train" : "_eval") +
         (c.pers > 0 ? "_pers" + std::to_string(c.pers) : "");
}

std::vector<GridCase> grid() {
  std::vector<GridCase> cases;
  for (size_t l = 0; l < layouts().size(); ++l)
    for (int64_t B : {1, 3})
      for (bool train : {false, true}) cases.push_back({l, B, train, 0});
  cases.push_back({0, 2, true, 3});  // persistent memory: always the plain path, whatever is asked
  cases.push_back({1, 2, false, 3});
  return cases;
}

}  // namespace

class FusedEqualsPlain : public ::testing::TestWithParam<GridCase> {};

TEST_P(FusedEqualsPlain, OverThreeBlocksWithCarriedCaches) {
  const GridCase c = GetParam();
  const Layout& layout = layouts()[c.layout];
  const BlockRun plain = run_blocks(AttnImpl::kPlain, layout, c.B, c.train, c.pers);
  const BlockRun fused = run_blocks(AttnImpl::kFused, layout, c.B, c.train, c.pers);
  const BlockRun automatic = run_blocks(AttnImpl::kAuto, layout, c.B, c.train, c.pers);
  for (size_t l = 0; l < plain.fused_layers.size(); ++l) {
    EXPECT_FALSE(plain.fused_layers[l]);
    EXPECT_EQ(fused.fused_layers[l], c.pers == 0) << "layer " << l;
  }
  // The layouts reach both ways of projecting values.
  if (c.pers == 0) EXPECT_EQ(fused.per_head_layers[0], layout.per_head_values) << "per-head value projection";
  expect_same(fused, plain, "fused vs plain");
  expect_same(automatic, plain, "auto vs plain");
}

INSTANTIATE_TEST_SUITE_P(Layouts, FusedEqualsPlain, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return case_name(info.param); });

// `generate` feeds one token at a time against the caches; that must give the logits of block
// processing, on every path.
TEST(Decode, OneTokenStepsEqualBlockProcessing) {
  for (size_t li : {size_t{0}, size_t{1}}) {
    for (AttnImpl impl : {AttnImpl::kPlain, AttnImpl::kFused, AttnImpl::kAuto}) {
      SCOPED_TRACE(std::string(layouts()[li].name) + " " + attention::attn_impl_name(impl));
      auto config = model_config(0);
      config.attn_impl = impl;
      torch::manual_seed(5);
      models::TransformerSeq model(config);
      model->to(torch::kDouble);
      model->eval();
      set_spans(model, layouts()[li].z);
      torch::NoGradGuard no_grad;
      const int64_t M = config.block_size, T = 3 * M;
      auto ids = torch::randint(config.vocab_size, {1, T}, torch::kLong);            // (1, T)
      auto block_caches = model->initial_caches(1);
      std::vector<torch::Tensor> blocks;
      for (int64_t b = 0; b < 3; ++b) blocks.push_back(model->logits(model->forward(ids.narrow(1, b * M, M), block_caches)));
      auto by_block = torch::cat(blocks, 1);                                         // (1, T, V)
      auto token_caches = model->initial_caches(1);
      std::vector<torch::Tensor> steps;
      for (int64_t t = 0; t < T; ++t) steps.push_back(model->logits(model->forward(ids.narrow(1, t, 1), token_caches)));
      auto by_token = torch::cat(steps, 1);                                          // (1, T, V)
      EXPECT_LT(max_rel_diff(by_token, by_block), 1e-10);
    }
  }
}

// A head can switch itself off by scoring the keys beyond its span far above those inside it: the
// reference's 1e-8 Z term then dominates the renormalisation and the head's output nearly vanishes.
// Trained models do this; the fused op must reproduce it (without it: 0.1 bpc lost).
TEST(SpanAttentionOpSemantics, KeysBeyondTheSpanCountInTheNormaliser) {
  const int64_t B = 1, K = 2, M = 8, W = 64, D = 8, L = 64;
  torch::manual_seed(3);
  auto q = torch::randn({B, K, M, D}, torch::kDouble) * 0.1;
  auto k = torch::randn({B, K, W + M, D}, torch::kDouble) * 0.1;
  auto v = torch::randn({B, K, W + M, D}, torch::kDouble);
  auto pe = torch::zeros({D, L}, torch::kDouble);
  // Distances beyond 20 get a large position score for head 0: 30 nats above the in-span keys.
  {
    torch::NoGradGuard g;
    q.select(1, 0).select(-1, 0).fill_(1.0);
    pe.select(0, 0).narrow(0, 0, L - 20).fill_(30.0 * std::sqrt(double(D)));
  }
  auto ratio = torch::tensor({2.0 / L, 2.0 / L}, torch::kDouble);  // z = 2: visits 11 distances with R 8
  for (auto* t : {&q, &k, &v, &pe, &ratio}) t->requires_grad_(true);
  ops::SpanAttentionOptions o;
  o.attn_span = L;
  o.ramp = 8;
  auto fused = ops::adaptive_span_attention(q, k, v, pe, ratio, o);
  auto ref = ops::adaptive_span_attention_reference(q, k, v, pe, ratio, o);
  // The switched-off head's output is ~1e-8 * e^-30-scaled noise away from 0; the other head's is O(1).
  EXPECT_LT(ref.select(1, 0).abs().max().item<double>(), 1e-3);
  EXPECT_GT(ref.select(1, 1).abs().max().item<double>(), 0.1);
  EXPECT_LT((fused - ref).abs().max().item<double>(), 1e-12);
  auto w = torch::randn_like(ref);
  auto gf = torch::autograd::grad({(fused * w).sum()}, {q, k, v, pe, ratio});
  auto gr = torch::autograd::grad({(ref * w).sum()}, {q, k, v, pe, ratio});
  for (size_t i = 0; i < gf.size(); ++i) EXPECT_LT(max_rel_diff(gf[i], gr[i]), 1e-11) << "gradient " << i;
}
