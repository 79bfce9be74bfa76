// The families the engine knows, and helpers they share (internal to the library).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "spanformer/train/family.h"

namespace spanformer::train {

std::unique_ptr<Family> make_adaptive_span_family(const nlohmann::json& config, const std::string& origin,
                                                  const std::vector<std::string>& overrides);
std::unique_ptr<Family> make_xl_family(const nlohmann::json& config, const std::string& origin,
                                       const std::vector<std::string>& overrides);

// A prompt as token ids: bytes of a byte vocabulary, whitespace-separated words of a word vocabulary
// (unknown words become <unk> when the vocabulary has it, else are skipped). Never empty: <eos> or id 0.
std::vector<int64_t> prompt_ids(const data::Vocab& vocab, const std::string& prompt);

// Runs warmup + steps calls of `step`, printing each one's time on stderr; returns the mean seconds
// of the timed ones.
double time_steps(const BenchRequest& request, const std::function<void()>& step);

}  // namespace spanformer::train
