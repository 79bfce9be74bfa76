// A sentence-pair file (tab-separated, Tatoeba's fra-eng layout) as the seq2seq family prepares it.
#include "fuzz.h"
#include "spanformer/data/pairs.h"

SPANFORMER_FUZZ_TARGET(pairs) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".txt");
  return spanformer::fuzz::expect_refusal([&] {
    spanformer::data::PairsOptions o;
    o.valid_pairs = 1;
    o.test_pairs = 1;
    o.min_freq = 1;
    auto set = spanformer::data::load_pairs(path, o);
    for (const auto& p : set.train) (void)spanformer::data::decode_sentence(p.tgt, set.vocab);
  });
}
