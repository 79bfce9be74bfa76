// BLEU and the 13a tokenisation against sacrebleu 2.6.0's own outputs (tests/data/bleu_cases.json, made
// by tests/python/bleu_oracle.py where sacrebleu is installed): tokens exactly, n-gram statistics
// exactly, scores to 1e-9 (the same double arithmetic in another order).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "spanformer/metrics/bleu.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "util.h"

using namespace spanformer;

namespace {
nlohmann::json cases() {
  return nlohmann::json::parse(read_file(std::string(SPANFORMER_SOURCE_DIR) + "/tests/data/bleu_cases.json"));
}
}  // namespace

TEST(Bleu, Tokenize13aIsSacrebleus) {
  const auto all = cases();
  ASSERT_GE(all["tokenize_13a"].size(), 15u);
  for (const auto& pair : all["tokenize_13a"])
    EXPECT_EQ(metrics::tokenize_13a(pair[0].get<std::string>()), pair[1].get<std::string>()) << pair[0];
}

TEST(Bleu, CorpusBleuIsSacrebleus) {
  const auto all = cases();
  ASSERT_GE(all["corpus_bleu"].size(), 8u);
  for (const auto& c : all["corpus_bleu"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto bleu = metrics::corpus_bleu(c["hyps"].get<std::vector<std::string>>(),
                                           c["refs"].get<std::vector<std::vector<std::string>>>());
    EXPECT_NEAR(bleu.score, c["score"].get<double>(), 1e-9);
    EXPECT_NEAR(bleu.brevity_penalty, c["bp"].get<double>(), 1e-12);
    EXPECT_EQ(bleu.stats.sys_len, c["sys_len"].get<int64_t>());
    EXPECT_EQ(bleu.stats.ref_len, c["ref_len"].get<int64_t>());
    for (size_t n = 0; n < 4; ++n) {
      EXPECT_EQ(bleu.stats.correct[n], c["counts"][n].get<int64_t>()) << "order " << n + 1;
      EXPECT_EQ(bleu.stats.total[n], c["totals"][n].get<int64_t>()) << "order " << n + 1;
    }
  }
}

TEST(Bleu, ReadableSummaryAndBadInput) {
  const auto bleu = metrics::corpus_bleu({"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."},
                                         {{"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
                                          {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."}});
  EXPECT_EQ(bleu.text(), "BLEU 48.53 82.4/50.0/45.5/37.5 (BP 0.943, ratio 0.944, hyp_len 17, ref_len 18)");
  EXPECT_EQ(tu::error_of([] { metrics::corpus_bleu({"a", "b"}, {{"a"}}); }),
            "BLEU: reference stream 1 has 1 lines for 2 hypotheses");
}
