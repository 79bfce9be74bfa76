// vocab.txt (a byte value or <eos> per line) and words.txt (a word per line), as `data` directories and
// `import --vocab` read them. Property: a vocabulary that parses writes back to text that parses to it.
#include "fuzz.h"
#include "spanformer/data/corpus.h"

SPANFORMER_FUZZ_TARGET(vocab) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return spanformer::fuzz::expect_refusal([&] {
    for (bool words : {false, true}) {
      try {
        auto v = words ? spanformer::data::parse_word_vocab(text, "fuzz") : spanformer::data::parse_vocab(text, "fuzz");
        const auto again = spanformer::data::vocab_to_text(v);
        auto w = words ? spanformer::data::parse_word_vocab(again, "again") : spanformer::data::parse_vocab(again, "again");
        if (w.tokens != v.tokens) spanformer::fuzz::fuzz_finding("a vocabulary does not survive its own text");
      } catch (const spanformer::Error&) {
      }
    }
  });
}
