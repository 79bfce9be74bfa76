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

// Spans as adaptive-span models learn them (bench --span-dist bimodal): in each layer's span_ratio (K),
// 3 of 4 heads get z in [16, min(256, L)], 1 of 4 in [min(2048, L), L] (fixed seed).
void set_bimodal_spans(const std::vector<torch::Tensor>& span_ratios, double L);

}  // namespace spanformer::train
