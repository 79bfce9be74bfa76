// A checkpoint's figure on a data split by its family's protocol: what `spanformer eval` prints and
// what Python's `spanformer.load(RUN).evaluate()` returns (one implementation for both).
//
//   language models   bpc or ppl of the split (or of a headerless one-byte id file), from the family's
//                     evaluate(): the adaptive-span reference's full_eval, Transformer-XL's protocol, GPT's
//   example families  accuracy and NLL (ViT's images; seq2seq's target tokens, plus corpus BLEU)
//
// The record is one JSON object (checkpoint, split, data, unit, the figure, nll, counts, seconds, step);
// `text` is the one-line report. With a process group every rank scores its share and the main rank
// holds the totals (others get main = false and an empty record).
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "spanformer/metrics/units.h"
#include "spanformer/train/family.h"

namespace spanformer::train {

struct CheckpointEval {
  std::string data;           // prepared data directory or image set ("": the one the model was trained on)
  std::string split = "test"; // train | valid | test
  int64_t batch = -1;         // streams, or examples per forward (-1: the config's eval_batch_size)
  std::optional<metrics::Unit> unit;  // language models: bpc | ppl (none: bpc for byte vocabularies, ppl for words)
  std::string ids;            // language models: score this headerless one-byte id file instead of a split
  std::string text;           // language models: score this text file, tokenized with the checkpoint's vocabulary
                              // (byte or GPT-2 BPE), instead of a split
  std::string vocab;          // vocab.txt the ids were made with (must be the checkpoint's)
  std::string dump_logprobs;  // language models: one log-probability per scored token to this file
  std::string dump_outputs;   // example families: "expected<TAB>produced" per example to this file
  dist::Group* group = nullptr;
  std::function<void(int64_t, int64_t)> progress;  // (blocks done, total), language models
};

struct CheckpointEvalResult {
  nlohmann::json record;
  std::string text;
  bool main = true;  // false on the non-main ranks of a process group
};

CheckpointEvalResult evaluate_checkpoint(const Checkpoint& checkpoint, Family& family, const CheckpointEval& request);

}  // namespace spanformer::train
