// Opening a checkpoint as the commands do and running the model a little (fuzz targets).
#pragma once
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz.h"
#include "spanformer/data/corpus.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/family.h"

namespace spanformer::fuzz {

inline void sample_two(train::Family& family, const data::Vocab& vocab) {
  family.module().eval();
  train::SampleRequest request;
  request.prompt = "a";
  request.tokens = 2;
  request.on_text = [](const std::string&) {};
  auto* sampling = family.as<train::Sampling>();
  if (!sampling) return;
  try {
    sampling->sample(vocab, request);
  } catch (const Error&) {  // a refusal (non-finite logits of fuzzed weights ...) is one line
  }
}

// A reference state_dict as `spanformer import KIND FILE --config CONFIG --vocab VOCAB` reads it: the
// family of `config` (JSON) with a byte vocabulary of 'a'..'z', space and newline (28 entries: the size
// of the vocabulary of scripts/fuzz.sh's seed text, whose runs the seeds are exported from), the
// weights imported, two tokens sampled.
inline void use_reference(const std::string& kind, const std::string& path, const char* config) {
  static const data::Vocab vocab = [] {
    const std::string file = scratch_dir() + "/vocab.txt";
    std::ofstream out(file);
    for (int c = 'a'; c <= 'z'; ++c) out << c << "\n";
    out << int(' ') << "\n" << int('\n') << "\n";
    out.close();
    return data::read_vocab(file);
  }();
  auto family = train::family_from_json(nlohmann::json::parse(config), "fuzz config");
  family->set_vocab_size(vocab.size(), "fuzz vocabulary");
  family->validate();
  family->build();
  family->need<train::ReferenceWeights>("import from " + kind).import_weights(kind, path);
  sample_two(*family, vocab);
}

inline void use_checkpoint(const std::string& path) {
  train::Checkpoint ck(path);
  auto family = train::family_from_checkpoint(ck);
  sample_two(*family, ck.vocab());
}

}  // namespace spanformer::fuzz
