// BLEU's summary line and its refusals. Its figures are held to sacrebleu itself, in the same process,
// by tests/python/test_oracles.py (random corpora and a trained model's translations).
#include <gtest/gtest.h>

#include "spanformer/metrics/bleu.h"
#include "spanformer/util/error.h"
#include "util.h"

using namespace spanformer;

TEST(Bleu, ReadableSummaryAndBadInput) {
  const auto bleu = metrics::corpus_bleu({"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."},
                                         {{"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
                                          {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."}});
  EXPECT_EQ(bleu.text(), "BLEU 48.53 82.4/50.0/45.5/37.5 (BP 0.943, ratio 0.944, hyp_len 17, ref_len 18)");
  EXPECT_EQ(tu::error_of([] { metrics::corpus_bleu({"a", "b"}, {{"a"}}); }),
            "BLEU: reference stream 1 has 1 lines for 2 hypotheses");
}
