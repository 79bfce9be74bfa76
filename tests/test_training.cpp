// Training behaviour: batch_split equivalence, exact resume, a real run whose loss falls, divergence
// and checkpoint errors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <fstream>

#include "spanformer/train/checkpoint.h"
#include "spanformer/train/trainer.h"
#include "spanformer/util/error.h"
#include "util.h"

using namespace spanformer;
using tu::error_of;

namespace {
Config tiny(const std::string& data) {
  Config c;
  c.model.nb_layers = 2;
  c.model.hidden_size = 16;
  c.model.inner_hidden_size = 32;
  c.model.nb_heads = 2;
  c.model.attn_span = 40;
  c.model.block_size = 16;
  c.model.dropout = 0.1;  // exercises the random generator across a resume
  c.model.adapt_span_ramp = 8;
  c.model.adapt_span_init = 0.3;
  c.train.data = data;
  c.train.batch_size = 8;
  c.train.lr_warmup = 5;
  c.train.nb_steps = 100;
  c.train.eval_interval = 10;
  c.train.eval_blocks = 2;
  c.train.threads = 2;
  return c;
}

std::vector<nlohmann::json> read_log(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}
}  // namespace

TEST(Training, BatchSplitGivesTheSameUpdate) {
  ModelConfig mc = tiny("").model;
  mc.vocab_size = 13;
  mc.dropout = 0;  // the split draws dropout masks in another order
  auto x = torch::randint(13, {4, 16}, torch::kLong), y = torch::randint(13, {4, 16}, torch::kLong);
  std::vector<std::vector<torch::Tensor>> params, caches;
  for (int64_t split : {1, 2, 4}) {
    torch::manual_seed(9);
    models::TransformerSeq model(mc);
    model->to(torch::kDouble);
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    train::Optimizer opt(named, {OptimKind::kAdagrad, 0, 0.03});
    auto c = model->initial_caches(4);
    for (auto& t : c) t = torch::randn_like(t);
    for (int step = 0; step < 2; ++step) train::train_step(model, opt, x, y, c, split, 0.07);
    std::vector<torch::Tensor> ps;
    for (auto& p : model->parameters()) ps.push_back(p.detach().clone());
    params.push_back(ps);
    caches.push_back(c);
  }
  for (size_t s = 1; s < params.size(); ++s) {
    for (size_t i = 0; i < params[0].size(); ++i)
      // Double precision; only the summation order differs. Adagrad's per-element g / sqrt(sum g^2)
      // amplifies that for elements whose gradient nearly cancels (rare tokens' embeddings), hence 1e-9.
      EXPECT_LT((params[0][i] - params[s][i]).abs().max().item<double>(), 1e-9) << "split case " << s << " param " << i;
    for (size_t l = 0; l < caches[0].size(); ++l) EXPECT_TRUE(torch::allclose(caches[0][l], caches[s][l], 0, 1e-12));
  }
}

TEST(Training, FusedAttentionStepEqualsThePlainStep) {
  ModelConfig mc = tiny("").model;
  mc.vocab_size = 13;
  mc.dropout = 0;  // the two paths draw dropout masks from different streams
  mc.attn_span = 100;
  mc.adapt_span_init = 0.1;  // z = 10: the fused op visits 19 of the 100 distances
  auto x = torch::randint(13, {3, 16}, torch::kLong), y = torch::randint(13, {3, 16}, torch::kLong);
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<double> losses;
  for (const char* impl : {"plain", "fused"}) {
    mc.attn_impl = attention::parse_attn_impl(impl);
    torch::manual_seed(9);
    models::TransformerSeq model(mc);
    model->to(torch::kDouble);
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    // Adagrad, the reference's optimizer: it divides each element by its own gradient's size, so the
    // tiny gradients that key_pe columns beyond every span get through the 1e-8 Z term must agree too.
    train::Optimizer opt(named, {OptimKind::kAdagrad, 0, 0.03});
    auto c = model->initial_caches(3);
    double loss = 0;
    for (int step = 0; step < 3; ++step) loss = train::train_step(model, opt, x, y, c, 1, 0.07).item<double>();
    losses.push_back(loss);
    std::vector<torch::Tensor> ps;
    for (auto& p : model->parameters()) ps.push_back(p.detach().clone());
    params.push_back(ps);
  }
  // Same arithmetic in another order, in double; as in BatchSplitGivesTheSameUpdate, Adagrad's
  // per-element g / sqrt(sum g^2) amplifies the rounding of elements whose gradient nearly cancels
  // (measured 1.04e-10), hence 1e-9.
  EXPECT_NEAR(losses[0], losses[1], 1e-12);
  for (size_t i = 0; i < params[0].size(); ++i)
    EXPECT_LT((params[0][i] - params[1][i]).abs().max().item<double>(), 1e-9) << "param " << i;
}

TEST(Training, SpanParametersStayClampedAfterEveryStep) {
  ModelConfig mc = tiny("").model;
  mc.vocab_size = 13;
  mc.adapt_span_init = 0.0;
  mc.adapt_span_loss = 10.0;  // pushes spans below zero: only the clamp keeps them in range
  torch::manual_seed(1);
  models::TransformerSeq model(mc);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
  train::Optimizer opt(named, {OptimKind::kSgd, 0, 0});
  auto c = model->initial_caches(2);
  auto x = torch::randint(13, {2, 16}, torch::kLong);
  for (int step = 0; step < 3; ++step) {
    train::train_step(model, opt, x, x, c, 1, 1.0);
    for (auto& layer : model->layers) {
      EXPECT_GE(layer->attn->span->span_ratio.min().item<float>(), 0.0f);
      EXPECT_LE(layer->attn->span->span_ratio.max().item<float>(), 1.0f);
    }
  }
}

TEST(Training, ResumeContinuesBitForBit) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);  // short: the run wraps around the data
  Config config = tiny(tmp.path());
  train::RunOptions straight{tmp.file("a"), false, false, -1};
  train::run_training(config, straight);
  train::RunOptions first{tmp.file("b"), false, false, 37};  // stops mid-interval
  EXPECT_EQ(train::run_training(config, first).steps, 37);
  train::RunOptions second{tmp.file("b"), true, false, -1};
  EXPECT_EQ(train::run_training(config, second).steps, 100);

  train::CheckpointReader a(tmp.file("a/checkpoint.pt")), b(tmp.file("b/checkpoint.pt"));
  auto ma = a.load_model(), mb = b.load_model();
  auto pa = ma->named_parameters(), pb = mb->named_parameters();
  for (auto& item : pa) EXPECT_TRUE(torch::equal(item.value(), *pb.find(item.key()))) << item.key();
  auto sa = a.load_state(2), sb = b.load_state(2);
  EXPECT_EQ(sa.train_pos, sb.train_pos);
  EXPECT_EQ(sa.valid_pos, sb.valid_pos);
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(torch::equal(sa.train_caches[l], sb.train_caches[l]));
  EXPECT_TRUE(torch::equal(sa.rng_state, sb.rng_state));
  // The resumed log continues the first one: one record per interval, no gap, no repeat.
  auto log = read_log(tmp.file("b/log.jsonl"));
  ASSERT_EQ(log.size(), 10u);  // 10, 20, ..., 100: the stop at 37 adds no record
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i]["step"], 10 * (i + 1));
    EXPECT_EQ(log[i]["valid_bpc"], read_log(tmp.file("a/log.jsonl"))[i]["valid_bpc"]);
  }
}

TEST(Training, LossFallsOnRealText) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 400000);
  Config config = tiny(tmp.path());
  config.model.hidden_size = 64;
  config.model.inner_hidden_size = 128;
  config.model.dropout = 0;
  config.model.block_size = 32;
  config.train.nb_steps = 200;
  config.train.eval_interval = 20;
  config.train.eval_blocks = 10;
  train::run_training(config, {tmp.file("run"), false, false, -1});
  auto log = read_log(tmp.file("run/log.jsonl"));
  ASSERT_EQ(log.size(), 10u);
  const double first = log.front()["valid_bpc"], last = log.back()["valid_bpc"];
  // Uniform guessing over ~90 symbols is 6.5 bits; character unigram statistics alone give ~4.4.
  EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
  EXPECT_LT(last, 4.0);
  for (const auto& r : log) {
    EXPECT_TRUE(r.contains("tokens_per_s") && r.contains("span_mean") && r.contains("eta_s"));
    EXPECT_EQ(r["span_mean"].size(), 2u);
  }
}

TEST(Training, DivergenceStopsWithAClearError) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);
  Config config = tiny(tmp.path());
  config.train.optim = OptimKind::kSgd;
  config.train.grad_clip = 0;
  config.train.lr = 1e30;
  config.train.lr_warmup = 0;
  auto message = error_of([&] { train::run_training(config, {tmp.file("run"), false, false, -1}); });
  EXPECT_NE(message.find("training diverged"), std::string::npos) << message;
}

TEST(Checkpoint, BadCheckpointsAreRefusedClearly) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);
  Config config = tiny(tmp.path());
  config.train.nb_steps = 3;
  train::run_training(config, {tmp.file("run"), false, false, -1});
  const std::string good = tmp.file("run/checkpoint.pt");
  std::string bytes = read_file(good);
  tu::write_text(tmp.file("truncated.pt"), bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(error_of([&] { train::CheckpointReader r(tmp.file("truncated.pt")); }).find("not a readable"), std::string::npos);
  tu::write_text(tmp.file("foreign.pt"), "hello");
  EXPECT_NE(error_of([&] { train::CheckpointReader r(tmp.file("foreign.pt")); }).find("not a readable"), std::string::npos);
  EXPECT_NE(error_of([&] { train::CheckpointReader r(tmp.file("none.pt")); }).find("not found"), std::string::npos);
  // Another model config.
  train::CheckpointReader reader(good);
  ModelConfig other = reader.config().model;
  other.nb_heads = 4;
  models::TransformerSeq model(other);
  EXPECT_NE(error_of([&] { reader.load_model_into(model); }).find("another model: nb_heads"), std::string::npos);
  // Resuming with a different model config is refused, the checkpoint is left as it was.
  Config changed = config;
  changed.model.hidden_size = 32;
  changed.train.nb_steps = 6;
  EXPECT_NE(error_of([&] { train::run_training(changed, {tmp.file("run"), true, false, -1}); }).find("another model"),
            std::string::npos);
  EXPECT_EQ(read_file(good), bytes);
}
