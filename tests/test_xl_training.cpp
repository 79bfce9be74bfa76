// The Transformer-XL family's config, schedules, word data, evaluation protocol and runs on the engine.
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

// A periodic word text prepared into dir/data (train; valid = test = its first 400 bytes).
void prepare_periodic_words(const tu::TempDir& dir) {
  data::WordPrepareOptions o;
  std::string text;
  for (int i = 0; i < 60; ++i) text += "the cat sat on the mat and the dog sat on the log\n";
  o.train = write_text(dir, "train", text);
  o.valid = write_text(dir, "valid", text.substr(0, 400));
  o.test = o.valid;
  data::prepare_words(o, dir.file("data"));
}

// train.amp = bf16 (tests/util.h): relative attention with memories, the adaptive softmax in fp32.
TEST(XlTraining, MixedPrecisionBf16TrainsAndResumesBitForBit) {
  tu::TempDir dir;
  prepare_periodic_words(dir);
  tu::expect_bf16_run(to_json(run_config(dir.file("data"), false)), dir.path(), 3, 0.03);
}

TEST(XlTraining, ResumedRunContinuesBitForBitAndTheLossFalls) {
  tu::TempDir dir;
  prepare_periodic_words(dir);
  auto run = [](const XlConfig& c, const std::string& out, bool resume, int64_t stop_after) {
    return tu::run_family(to_json(c), out, resume, stop_after);
  };
  for (bool search : {false, true}) {
    auto c = run_config(dir.file("data"), search);
    // At 3e-3 eight steps leave the perplexity near 8 (7.4-8.1 over four seeds, dropout masks included);
    // at 1e-2 they bring it to 5.6-7.4, so the check below sees learning rather than a lucky draw.
    c.train.lr = 1e-2;
    const std::string a_dir = dir.file(search ? "s1" : "p1"), b_dir = dir.file(search ? "s2" : "p2");
    auto r1 = run(c, a_dir, false, -1);
    run(c, b_dir, false, 3);  // stop inside an interval, away from a checkpoint boundary
    auto r2 = run(c, b_dir, true, -1);
    EXPECT_EQ(r2.steps, 8);
    EXPECT_EQ(r1.unit, metrics::Unit::kPpl);
    // Every weight, optimizer state (both optimizers of a super-network), memory and the generator.
    train::Checkpoint a(a_dir + "/checkpoint.pt");
    EXPECT_EQ(a.family(), "xl");
    {
      SCOPED_TRACE(fmt::format("search {}", search));
      tu::expect_same_checkpoint(a_dir + "/checkpoint.pt", b_dir + "/checkpoint.pt");
    }
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
