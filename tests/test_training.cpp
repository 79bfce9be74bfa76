// Training behaviour: batch_split equivalence, exact resume, a real run whose loss falls, divergence
// and checkpoint errors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "spanformer/nn/linear.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/train/checkpoint.h"
#include "train/families/adaptive_span/train_step.h"
#include "spanformer/train/runner.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"
#include "util.h"

using namespace spanformer;
using tu::error_of;

namespace {
AdaptiveSpanConfig tiny(const std::string& data) {
  AdaptiveSpanConfig c;
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
  c.train.threads = 0;  // OMP_NUM_THREADS (one under scripts/test.sh), else every core
  return c;
}

train::StepContext lr_of(double lr) {
  train::StepContext ctx;
  ctx.lr = lr;
  return ctx;
}

// A run of the adaptive-span family on the one runner.
train::RunResult run(const AdaptiveSpanConfig& config, const std::string& out, bool resume = false, int64_t stop_after = -1) {
  return tu::run_family(to_json(config), out, resume, stop_after);
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
    for (int step = 0; step < 2; ++step) train::train_step(model, opt, x, y, c, split, lr_of(0.07));
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
    // The caches of the second step come from parameters that already differ by that rounding (up to
    // ~1e-10 after the first update), so they are held to the parameters' tolerance too: 1e-12 failed
    // once in CI under load (Debian's LibTorch 1.13, 2 threads), a split that changed anything but the
    // summation order would miss by orders of magnitude more.
    for (size_t l = 0; l < caches[0].size(); ++l)
      EXPECT_LT((caches[0][l] - caches[s][l]).abs().max().item<double>(), 1e-9) << "split case " << s << " cache " << l;
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
    for (int step = 0; step < 3; ++step) loss = train::train_step(model, opt, x, y, c, 1, lr_of(0.07)).item<double>();
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
    train::train_step(model, opt, x, x, c, 1, lr_of(1.0));
    for (auto& layer : model->layers) {
      EXPECT_GE(layer->attn->span->span_ratio.min().item<float>(), 0.0f);
      EXPECT_LE(layer->attn->span->span_ratio.max().item<float>(), 1.0f);
    }
  }
}

TEST(Training, ResumeContinuesBitForBit) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);  // short: the run wraps around the data
  AdaptiveSpanConfig config = tiny(tmp.path());
  run(config, tmp.file("a"));
  EXPECT_EQ(run(config, tmp.file("b"), false, 37).steps, 37);  // stops mid-interval
  EXPECT_EQ(run(config, tmp.file("b"), true).steps, 100);

  // Every weight, optimizer state, data position, cache and the generator state agree bit for bit.
  tu::expect_same_checkpoint(tmp.file("a/checkpoint.pt"), tmp.file("b/checkpoint.pt"));
  // The resumed log continues the first one: one record per interval, no gap, no repeat, the same figures
  // (the interval 31-40, cut by the stop at 37, averages all ten training losses: the checkpoint carries
  // the seven before the stop).
  auto log = read_log(tmp.file("b/log.jsonl"));
  const auto uninterrupted = read_log(tmp.file("a/log.jsonl"));
  ASSERT_EQ(log.size(), 10u);  // 10, 20, ..., 100: the stop at 37 adds no record
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i]["step"], 10 * (i + 1));
    EXPECT_EQ(log[i]["valid_bpc"], uninterrupted[i]["valid_bpc"]);
    EXPECT_EQ(log[i]["train_loss"], uninterrupted[i]["train_loss"]) << "step " << 10 * (i + 1);
  }
}

// The guard train.amp uses: matrix products in bf16 inside, float32 again after, nested guards too.
TEST(Training, AutocastGuardCastsMatrixProductsAndRestores) {
  auto a = torch::randn({4, 4});
  {
    compat::AutocastGuard outer(c10::DeviceType::CPU, at::kBFloat16);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kBFloat16);
    EXPECT_EQ(compat::autocast_dtype(c10::DeviceType::CPU), at::kBFloat16);
    {
      compat::AutocastGuard inner(c10::DeviceType::CPU, at::kBFloat16);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kBFloat16);
    }
    EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kFloat);
  EXPECT_FALSE(compat::autocast_dtype(c10::DeviceType::CPU).has_value());
}

// The models' Linear (ATen's linear) against x W^T + b in float64, on 2-D and batched 3-D inputs, with
// and without a bias: the output and every gradient. Under bf16 autocast its output is bf16, within
// bf16's rounding of the product of the rounded operands (the bias folded into the product, not added
// in a second pass).
TEST(Training, LinearIsXWTransposedPlusBiasAndNarrowsUnderAutocast) {
  torch::manual_seed(3);
  for (bool with_bias : {true, false}) {
    for (auto sizes : {std::vector<int64_t>{5, 7}, std::vector<int64_t>{3, 4, 7}}) {
      SCOPED_TRACE(std::string(with_bias ? "bias, " : "no bias, ") + std::to_string(sizes.size()) + "-D");
      spanformer::nn::Linear layer(torch::nn::LinearOptions(7, 6).bias(with_bias));
      layer->to(at::kDouble);
      auto x = torch::randn(sizes, at::kDouble).requires_grad_();
      auto y = layer(x);                                                          // (..., 6)
      auto w = layer->weight.detach().clone().requires_grad_();
      auto b = with_bias ? layer->bias.detach().clone().requires_grad_() : at::Tensor();
      auto x2 = x.detach().clone().requires_grad_();
      auto want = at::matmul(x2, w.t());
      if (with_bias) want = want + b;
      EXPECT_TRUE(at::allclose(y, want, 1e-14, 1e-14));
      auto g = torch::randn_like(want);
      y.backward(g);
      want.backward(g);
      EXPECT_TRUE(at::allclose(x.grad(), x2.grad(), 1e-14, 1e-14));
      EXPECT_TRUE(at::allclose(layer->weight.grad(), w.grad(), 1e-14, 1e-14));
      if (with_bias) EXPECT_TRUE(at::allclose(layer->bias.grad(), b.grad(), 1e-14, 1e-14));

      spanformer::nn::Linear narrow(torch::nn::LinearOptions(7, 6).bias(with_bias));
      auto xf = torch::randn(sizes);
      at::Tensor z;
      {
        compat::AutocastGuard guard(c10::DeviceType::CPU, at::kBFloat16);
        z = narrow(xf);
      }
      ASSERT_EQ(z.scalar_type(), at::kBFloat16);
      auto r = [](const at::Tensor& t) { return t.detach().to(at::kBFloat16).to(at::kDouble); };
      auto exact = at::matmul(r(xf), r(narrow->weight).t());
      if (with_bias) exact = exact + r(narrow->bias);
      // Rounded once to bf16 (relative 2^-8) from a float32 accumulation of 7 terms.
      EXPECT_LE((z.to(at::kDouble) - exact).abs().max().item<double>(), 1e-2 * (exact.abs().max().item<double>() + 1));
    }
  }
}

// train.amp = bf16 with the span-aware attention on both of its paths (tests/util.h, expect_bf16_run).
TEST(Training, MixedPrecisionBf16TrainsAndResumesBitForBit) {
  for (auto impl : {attention::AttnImpl::kPlain, attention::AttnImpl::kFused}) {
    SCOPED_TRACE(attention::attn_impl_name(impl));
    tu::TempDir tmp;
    tu::prepare_dickens_slice(tmp.path(), 12000);
    AdaptiveSpanConfig config = tiny(tmp.path());
    config.model.attn_impl = impl;
    config.train.nb_steps = 30;
    config.train.eval_interval = 15;
    tu::expect_bf16_run(to_json(config), tmp.path(), 17, 0.03);
  }
}

TEST(Training, LossFallsOnRealText) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 400000);
  AdaptiveSpanConfig config = tiny(tmp.path());
  config.model.hidden_size = 64;
  config.model.inner_hidden_size = 128;
  config.model.dropout = 0;
  config.model.block_size = 32;
  config.train.nb_steps = 200;
  config.train.eval_interval = 20;
  config.train.eval_blocks = 10;
  run(config, tmp.file("run"));
  auto log = read_log(tmp.file("run/log.jsonl"));
  ASSERT_EQ(log.size(), 10u);
  const double first = log.front()["valid_bpc"], last = log.back()["valid_bpc"];
  // Uniform guessing over ~90 symbols is 6.5 bits; character unigram statistics alone give ~4.4.
  EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
  EXPECT_LT(last, 4.0);
  for (const auto& r : log) {
    EXPECT_TRUE(r.contains("tokens_per_s") && r.contains("span_mean") && r.contains("eta_s"));
    EXPECT_NEAR(r["train_loss"].get<double>() / std::log(2.0), r["train_bpc"].get<double>(), 1e-12);
    EXPECT_EQ(r["span_mean"].size(), 2u);
    // Per-head spans: one row per layer, one value per head, whose mean and max are the layer's.
    ASSERT_EQ(r["spans"].size(), 2u);
    for (size_t l = 0; l < 2; ++l) {
      const auto heads = r["spans"][l].get<std::vector<double>>();
      ASSERT_EQ(static_cast<int64_t>(heads.size()), config.model.nb_heads);
      double sum = 0, max = 0;
      for (double z : heads) sum += z, max = std::max(max, z);
      EXPECT_NEAR(sum / static_cast<double>(heads.size()), r["span_mean"][l].get<double>(), 1e-9);
      EXPECT_EQ(max, r["span_max"][l].get<double>());
    }
  }
}

// A session stopped in the middle of a log line (a full disk, a killed process) leaves the line cut short.
// The next session leaves it out of log.jsonl and sessions.jsonl, says so once in train.log, and ends
// train.log's piece with a newline: every line of the three files stays one record (report and Python
// read them whole), and the resumed run's records are the uninterrupted run's.
TEST(Training, ResumeLeavesOutARecordCutShortAndSaysSo) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);
  AdaptiveSpanConfig config = tiny(tmp.path());
  run(config, tmp.file("a"));
  EXPECT_EQ(run(config, tmp.file("b"), false, 37).steps, 37);
  std::ofstream(tmp.file("b/log.jsonl"), std::ios::app) << R"({"step": 40, "train_lo)";
  std::ofstream(tmp.file("b/sessions.jsonl"), std::ios::app) << R"({"version": "0.)";
  std::ofstream(tmp.file("b/train.log"), std::ios::app) << "[2026-11-29T10:00:00Z] step 3";
  EXPECT_EQ(run(config, tmp.file("b"), true).steps, 100);
  const auto log = read_jsonl(tmp.file("b/log.jsonl"));  // every line a record: throws otherwise
  ASSERT_EQ(log.size(), 10u);
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i]["step"], 10 * (i + 1));
    EXPECT_EQ(log[i]["valid_bpc"], read_log(tmp.file("a/log.jsonl"))[i]["valid_bpc"]);
  }
  EXPECT_EQ(read_jsonl(tmp.file("b/sessions.jsonl")).size(), 2u);
  const auto text = read_file(tmp.file("b/train.log"));
  EXPECT_NE(text.find("[2026-11-29T10:00:00Z] step 3\n["), std::string::npos) << "the piece ends with its newline";
  EXPECT_NE(text.find("log.jsonl ended in a record cut short (22 bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("sessions.jsonl ended in a record cut short (15 bytes"), std::string::npos) << text;
  // Said once: a third session finds the files whole.
  EXPECT_EQ(run(config, tmp.file("b"), true).steps, 100);
  const auto again = read_file(tmp.file("b/train.log"));
  EXPECT_EQ(again.find("cut short", text.rfind("cut short") + 9), std::string::npos);
}

TEST(Training, DivergenceStopsWithAClearError) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);
  AdaptiveSpanConfig config = tiny(tmp.path());
  config.train.optim = OptimKind::kSgd;
  config.train.grad_clip = 0;
  config.train.lr = 1e30;
  config.train.lr_warmup = 0;
  auto message = error_of([&] { run(config, tmp.file("run")); });
  EXPECT_NE(message.find("training diverged"), std::string::npos) << message;
}

TEST(Checkpoint, BadCheckpointsAreRefusedClearly) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);
  AdaptiveSpanConfig config = tiny(tmp.path());
  config.train.nb_steps = 3;
  run(config, tmp.file("run"));
  const std::string good = tmp.file("run/checkpoint.pt");
  std::string bytes = read_file(good);
  tu::write_text(tmp.file("truncated.pt"), bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(error_of([&] { train::Checkpoint c(tmp.file("truncated.pt")); }).find("not a readable"), std::string::npos);
  tu::write_text(tmp.file("foreign.pt"), "hello");
  EXPECT_NE(error_of([&] { train::Checkpoint c(tmp.file("foreign.pt")); }).find("not a readable"), std::string::npos);
  EXPECT_NE(error_of([&] { train::Checkpoint c(tmp.file("none.pt")); }).find("not found"), std::string::npos);
  // Another model config.
  train::Checkpoint checkpoint(good);
  AdaptiveSpanConfig other = config;
  other.model.nb_heads = 4;
  other.model.vocab_size = checkpoint.vocab().size();
  auto family = train::family_from_json(to_json(other), "test");
  family->build();
  EXPECT_NE(error_of([&] { family->load_weights(checkpoint); }).find("another model: nb_heads"), std::string::npos);
  // Resuming with a different model config is refused, the checkpoint is left as it was.
  AdaptiveSpanConfig changed = config;
  changed.model.hidden_size = 32;
  changed.train.nb_steps = 6;
  EXPECT_NE(error_of([&] { run(changed, tmp.file("run"), true); }).find("another model"), std::string::npos);
  EXPECT_EQ(read_file(good), bytes);
}

// One flipped byte anywhere in a stored tensor is refused by name, never a NaN or a crash later.
TEST(Checkpoint, FlippedBytesFailTheirChecksum) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);
  AdaptiveSpanConfig config = tiny(tmp.path());
  config.train.nb_steps = 3;
  run(config, tmp.file("run"));
  const std::string bytes = read_file(tmp.file("run/checkpoint.pt"));
  train::Checkpoint ok(tmp.file("run/checkpoint.pt"));
  EXPECT_EQ(ok.version(), train::kCheckpointVersion);
  // Tensor records are stored raw in the zip: find each one's bytes and flip one bit in the middle.
  for (const std::string key : {"model.key_pe", "optim.key_pe.state1", "state.train_cache.0", "state.rng"}) {
    auto t = ok.tensor(key).contiguous();
    const std::string raw(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
    const auto at = bytes.find(raw);
    ASSERT_NE(at, std::string::npos) << key;
    std::string bad = bytes;
    bad[at + raw.size() / 2] = static_cast<char>(bad[at + raw.size() / 2] ^ 0x40);
    tu::write_text(tmp.file("bad.pt"), bad);
    // First line of defence: the zip's CRC-32 of the entry, checked before LibTorch parses anything.
    auto message = error_of([&] { train::Checkpoint c(tmp.file("bad.pt")); });
    EXPECT_NE(message.find("fails its CRC-32"), std::string::npos) << key << ": " << message;
    // With the CRC rewritten to match (a tool that edits files on purpose), spanformer's SHA-256 of the
    // value still refuses it, naming the key. The entry's bytes are the tensor's: its CRC is theirs.
    const auto crc_of = [](const std::string& s) {
      const auto c = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
      return std::string{static_cast<char>(c & 0xff), static_cast<char>((c >> 8) & 0xff), static_cast<char>((c >> 16) & 0xff),
                         static_cast<char>(c >> 24)};
    };
    const std::string old_crc = crc_of(raw), new_crc = crc_of(bad.substr(at, raw.size()));
    int patched = 0;
    for (size_t p = bad.find(old_crc); p != std::string::npos; p = bad.find(old_crc, p + 4), ++patched) bad.replace(p, 4, new_crc);
    EXPECT_GE(patched, 1) << key;
    tu::write_text(tmp.file("bad.pt"), bad);
    message = error_of([&] { train::Checkpoint c(tmp.file("bad.pt")); });
    EXPECT_NE(message.find("fails its checksum"), std::string::npos) << key << ": " << message;
  }
  EXPECT_EQ(ok.family(), "adaptive-span");
}


// Values that pass their checksum (the file was written so, not damaged in transit) are still checked
// against their bounds on load: positions within the data, steps non-negative, finite tensors, byte
// vocabularies.
TEST(Checkpoint, StoredValuesAreCheckedAgainstTheirBounds) {
  tu::TempDir tmp;
  tu::prepare_dickens_slice(tmp.path(), 12000);
  AdaptiveSpanConfig config = tiny(tmp.path());
  config.train.nb_steps = 3;
  run(config, tmp.file("run"));
  const std::string good = tmp.file("run/checkpoint.pt");
  // Rewrites the checkpoint as run "bad" with one entry replaced (and re-signed).
  auto resign = [&](const std::string& key, const torch::Tensor& value, const data::Vocab* vocab = nullptr) {
    train::Checkpoint in(good);
    train::CheckpointWriter out(in.family(), in.config(), vocab ? *vocab : in.vocab());
    for (const auto& [k, is_text] : in.entries()) {
      if (is_text) out.put_text(k, in.text(k));
      else out.put(k, k == key ? value : in.tensor(k));
    }
    tu::remove_tree(tmp.file("bad"));
    std::filesystem::create_directories(tmp.file("bad"));
    out.save(tmp.file("bad/checkpoint.pt"));
    std::filesystem::copy_file(tmp.file("run/config.json"), tmp.file("bad/config.json"));
  };
  auto resume_error = [&] {
    AdaptiveSpanConfig more = config;
    more.train.nb_steps = 6;
    return error_of([&] { run(more, tmp.file("bad"), true); });
  };
  train::Checkpoint ok(good);
  resign("state.step", torch::tensor(int64_t{-3}));
  EXPECT_NE(resume_error().find("is outside the data"), std::string::npos);
  resign("state.train_pos", torch::tensor(int64_t{1} << 40));
  EXPECT_NE(resume_error().find("is outside the data"), std::string::npos);
  auto nan_weight = ok.tensor("model.key_pe").clone();
  nan_weight.view(-1)[3] = std::nan("");
  resign("model.key_pe", nan_weight);
  EXPECT_NE(resume_error().find("parameter 'key_pe' holds non-finite values"), std::string::npos) << resume_error();
  auto inf_moment = ok.tensor("optim.key_pe.state1").clone();
  inf_moment.view(-1)[0] = INFINITY;
  resign("optim.key_pe.state1", inf_moment);
  EXPECT_NE(resume_error().find("optimizer state 'optim.key_pe.state1' holds non-finite values"), std::string::npos)
      << resume_error();
  for (const std::string token : {"999", "-51", "x"}) {
    data::Vocab vocab = ok.vocab();
    vocab.tokens[1] = token;
    resign("", torch::Tensor(), &vocab);
    const auto message = error_of([&] { train::Checkpoint c(tmp.file("bad")); });
    EXPECT_NE(message.find("expected a byte value 0..255 or <eos>, got '" + token + "'"), std::string::npos) << message;
  }
}

// Checkpoints written before the one engine (format version 1, one per family, written here with the
// exact keys the old writers used) still open, with their weights, state and old config spellings.
TEST(Checkpoint, VersionOneFilesOfBothFamiliesStillLoad) {
  tu::TempDir tmp;
  // adaptive span: "spanformer-checkpoint-v1"
  AdaptiveSpanConfig config = tiny("");
  config.model.vocab_size = 3;
  torch::manual_seed(3);
  models::TransformerSeq model(config.model);
  {
    torch::serialize::OutputArchive archive;
    archive.write("format", c10::IValue(std::string("spanformer-checkpoint-v1")));
    archive.write("config", c10::IValue(to_json(config).dump()));
    archive.write("vocab", c10::IValue(std::string("10\n97\n98\n")));
    for (const auto& item : model->named_parameters()) archive.write("model." + item.key(), item.value().detach());
    archive.write("state.step", torch::tensor(int64_t{7}));
    archive.save_to(tmp.file("v1.pt"));
  }
  train::Checkpoint v1(tmp.file("v1.pt"));
  EXPECT_EQ(v1.version(), 1);
  EXPECT_EQ(v1.family(), "adaptive-span");
  EXPECT_EQ(v1.vocab().size(), 3);
  EXPECT_TRUE(v1.has_train_state());
  EXPECT_EQ(v1.integer("state.step"), 7);
  auto family = train::family_from_checkpoint(v1);
  auto loaded = family->module().named_parameters();
  for (const auto& item : model->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), loaded[item.key()])) << item.key();

  // Transformer-XL: "spanformer-xl-checkpoint-v1" with the old train keys (warmup_steps, eval_segments,
  // the evaluation protocol in `train`).
  nlohmann::json xl = {{"arch", "xl"},
                       {"model", {{"n_layer", 1}, {"d_model", 8}, {"n_head", 2}, {"d_head", 4}, {"d_inner", 16},
                                  {"tgt_len", 4}, {"mem_len", 4}, {"vocab_size", 3}}},
                       {"train", {{"warmup_steps", 5}, {"eval_segments", 2}, {"eval_mem_len", 9}, {"optim", "adam"}}}};
  auto xl_family = train::family_from_json(xl, "old xl config");
  xl_family->build();
  {
    torch::serialize::OutputArchive archive;
    archive.write("format", c10::IValue(std::string("spanformer-xl-checkpoint-v1")));
    archive.write("config", c10::IValue(xl.dump()));
    archive.write("vocab", c10::IValue(std::string("a\nb\nc\n")));
    archive.write("vocab_level", c10::IValue(std::string("word")));
    for (const auto& item : xl_family->module().named_parameters())
      archive.write("model." + item.key(), item.value().detach());
    archive.save_to(tmp.file("xl1.pt"));
  }
  train::Checkpoint xl1(tmp.file("xl1.pt"));
  EXPECT_EQ(xl1.family(), "xl");
  EXPECT_TRUE(xl1.vocab().word_level);
  auto xl_loaded = train::family_from_checkpoint(xl1);
  const auto j = xl_loaded->config_json();
  EXPECT_EQ(j["train"]["lr_warmup"], 5);
  EXPECT_EQ(j["train"]["eval_blocks"], 2);
  EXPECT_EQ(j["run"]["eval_mem_len"], 9);  // train.eval_* (version 1), then model.eval_*, now run.eval_*
  auto p = xl_loaded->module().named_parameters();
  for (const auto& item : xl_family->module().named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), p[item.key()])) << item.key();
}
