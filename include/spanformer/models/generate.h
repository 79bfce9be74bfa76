// Sampling text from a trained model. The prompt is fed block by block; then every new token costs
// one forward step of length 1 against the layers' caches (which hold the last cache_size() inputs),
// so generation is linear in the number of tokens.
#pragma once
#include <functional>
#include <string>

#include "spanformer/data/corpus.h"
#include "spanformer/models/transformer_seq.h"

namespace spanformer::models {

struct GenerateOptions {
  int64_t tokens = 200;       // new tokens to sample
  double temperature = 1.0;   // > 0; lower is more conservative
  int64_t top_k = 0;          // 0 = sample from the whole vocabulary
};

// Returns the generated continuation (not including the prompt). Bytes of the prompt that are not in
// the vocabulary are skipped. on_token, when given, receives each new piece of text as it is sampled.
std::string generate(TransformerSeq& model, const data::Vocab& vocab, const std::string& prompt,
                     const GenerateOptions& options, const std::function<void(const std::string&)>& on_token = nullptr);

}  // namespace spanformer::models
