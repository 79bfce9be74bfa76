// Weight formats: the one table `spanformer import` and `spanformer export` read. Each row names a format,
// says in a line what import reads and export writes, and holds the two conversions; the CLI has no
// list of its own (its help text, its "not a kind of weights" message and its dispatch all come from here).
//
//   safetensors      every family: the parameters under their own names, family, config and vocabulary in
//                    __metadata__ (io/safetensors.h), the config also as a JSON file beside the weights
//   gpt2             transformers' GPT2LMHeadModel directory (the gpt family's models GPT-2 can express)
//   adaptive-span    facebookresearch/adaptive-span's state_dict  } a reference implementation's torch.save
//   transformer-xl   kimiyoung/transformer-xl's MemTransformerLM  } file; the model described by --config
//
// Adding a format: one row in src/train/formats.cpp (and, for a reference state_dict, the family's
// ReferenceWeights capability, family.h).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "spanformer/train/checkpoint.h"

namespace spanformer::train {

struct ImportRequest {
  std::string model;        // the file or directory to read
  std::string config;       // spanformer config of the model (reference state_dicts only)
  std::string vocab;        // the vocabulary in id order (reference state_dicts; gpt2 without vocab.txt)
  std::string vocab_level;  // "byte" or "word"
  std::vector<std::string> overrides;  // config overrides (reference state_dicts only)
  std::string out;          // the spanformer checkpoint to write
};

struct ImportResult {
  std::string note;                        // one line for stderr ("" when none)
  std::vector<std::vector<double>> spans;  // the imported model's learned spans, where it has them
};

struct WeightFormat {
  std::string name;
  std::string reads;    // what `import NAME FILE` reads
  std::string writes;   // what `export NAME CHECKPOINT --out OUT` writes
  std::function<ImportResult(const ImportRequest&)> import_weights;
  // Writes `out`; returns what to print after "exported CHECKPOINT -> OUT".
  std::function<std::string(const Checkpoint&, const std::string& out)> export_weights;
};

// Every format, in the order help text lists them.
const std::vector<WeightFormat>& weight_formats();
// The row of that name, or nullptr.
const WeightFormat* find_weight_format(const std::string& name);
std::vector<std::string> weight_format_names();

// The conversions the rows call, usable on their own.
// safetensors (the same for every family): import rebuilds a weights-only checkpoint from the file alone;
// every parameter must be present with its shape (float32, float64, float16 or bfloat16, stored as
// float32). Import returns whether the file carried spanformer's checksum of its tensors (checked).
void export_safetensors(const Checkpoint& checkpoint, const std::string& path, const std::string& config_path);
bool import_safetensors(const std::string& path, const std::string& checkpoint_path);
// model.safetensors -> model.json: where export_safetensors' config goes beside the weights.
std::string config_path_beside(const std::string& weights_path);

}  // namespace spanformer::train
