// GPT-2's byte-level BPE from a tokenizer.json (import gpt2, data tokenize). Properties: a tokenizer that
// loads encodes any bytes (the input itself) to ids that decode to those bytes.
#include "fuzz.h"
#include "spanformer/data/byte_bpe.h"

SPANFORMER_FUZZ_TARGET(bpe) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return spanformer::fuzz::expect_refusal([&] {
    try {
      const auto bpe = spanformer::data::ByteBpe::from_tokenizer_json(text, "fuzz");
      try {
        if (bpe->decode(bpe->encode(text)) != text) spanformer::fuzz::fuzz_finding("decode(encode(x)) is not x");
      } catch (const spanformer::Error&) {  // a vocabulary without every byte: refused by name
      }
    } catch (const spanformer::Error&) {
    }
  });
}
