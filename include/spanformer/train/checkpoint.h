// Checkpoints: one format for every model family, integrity-checked.
//
// A checkpoint is one zip archive (LibTorch's serialize format) holding everything a run needs to
// continue bit for bit. Format version 2 (the one engine) keys:
//   "format"       "spanformer-checkpoint"           "version"   2
//   "family"       "adaptive-span" | "xl" | ...      "config"    the whole config (JSON text)
//   "vocab"        vocabulary text, one token a line  "vocab_level" "byte" | "word" | "sentencepiece"
//   "vocab_model"  the SentencePiece model's bytes, or the byte-level BPE's tokenizer.json (uint8 tensor;
//                  levels sentencepiece and bpe only)
//   "model.<name>" parameters                         "optim.*", "arch_optim.*"  optimizer state
//   "state.*"      training state: step, data positions, carried caches/memories, generator state
//   "manifest"     JSON {key: SHA-256 of the entry} over every other entry
// Opening verifies every entry against the manifest and refuses entries the manifest does not list, so
// a flipped byte, a truncated tensor or a foreign entry is one clear error naming the file and key,
// never a NaN or a crash later. Writes are atomic (temporary file + rename); a failed write (full disk)
// is an Error and leaves any older checkpoint in place.
//
// Version 1 files (before the one engine: "spanformer-checkpoint-v1" for adaptive span and
// "spanformer-xl-checkpoint-v1" for Transformer-XL/PAR) still open, without the integrity check.
#pragma once
#include <torch/serialize/archive.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "spanformer/data/corpus.h"

namespace spanformer::train {

inline constexpr const char* kCheckpointFormat = "spanformer-checkpoint";
inline constexpr int64_t kCheckpointVersion = 2;

class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& family, const nlohmann::json& config, const data::Vocab& vocab);
  void put(const std::string& key, const torch::Tensor& tensor);  // stored contiguous, on the CPU
  void put_text(const std::string& key, const std::string& text);
  void put_int(const std::string& key, int64_t value);
  void put_double(const std::string& key, double value);
  // Adds the manifest and writes `path` atomically; throws Error (naming the path) when it cannot.
  void save(const std::string& path);

 private:
  torch::serialize::OutputArchive archive_;
  nlohmann::json manifest_ = nlohmann::json::object();
};

class Checkpoint {
 public:
  // Opens and verifies `path` (a file, or a run directory holding checkpoint.pt).
  explicit Checkpoint(const std::string& path);

  const std::string& path() const { return path_; }
  const std::string& family() const { return family_; }
  int64_t version() const { return version_; }
  const nlohmann::json& config() const { return config_; }
  const data::Vocab& vocab() const { return vocab_; }

  bool has(const std::string& key) const;
  // Each fails with "checkpoint PATH has no 'KEY'" when the entry is missing.
  torch::Tensor tensor(const std::string& key) const;
  std::string text(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool has_train_state() const { return has("state.step"); }
  // Every stored entry of a version-2 file other than the header (format, version, family, config,
  // vocab, vocab_level, vocab_model, manifest), as (key, is_text).
  std::vector<std::pair<std::string, bool>> entries() const;

  // Copies "<prefix><name>" into every parameter, naming the key on a missing entry, another shape
  // or non-finite values.
  void read_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params,
                       const std::string& prefix = "model.") const;

 private:
  std::string path_, family_;
  int64_t version_ = 0;
  nlohmann::json config_;
  data::Vocab vocab_;
  mutable torch::serialize::InputArchive archive_;  // version 1: entries read on demand
  std::map<std::string, torch::Tensor> tensors_;    // version 2: every verified entry
  std::map<std::string, std::string> texts_;
};

// "checkpoint.pt" inside a run directory, or the path itself.
std::string checkpoint_file(const std::string& path);

// Whether the file `path` carries a spanformer format marker (any version), read without verifying
// its entries: a damaged checkpoint of ours is still ours. `import` asks this before it tries a zip as
// the reference's torch.save state_dict.
bool has_checkpoint_marker(const std::string& path);

}  // namespace spanformer::train
