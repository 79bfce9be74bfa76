// A SentencePiece model (the bytes a seq2seq checkpoint or safetensors file carries for a subword
// vocabulary) as the vocabulary loader takes it: parsed, its special ids checked, then a sentence
// encoded and decoded and the pieces listed.
#include "fuzz.h"
#include "spanformer/data/subwords.h"

SPANFORMER_FUZZ_TARGET(sentencepiece) {
  return spanformer::fuzz::expect_refusal([&] {
    if (!spanformer::data::subwords_available()) return;
    spanformer::data::SubwordModel model(std::string(reinterpret_cast<const char*>(data), size), "fuzzed model");
    const auto ids = model.encode("you see the dog .");
    (void)model.decode(ids);
    (void)model.pieces();
  });
}
