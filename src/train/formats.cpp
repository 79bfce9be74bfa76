// safetensors export and import, the same for every family (train/family.h).
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <map>

#include <fmt/format.h>

#include "spanformer/data/subwords.h"
#include "spanformer/io/safetensors.h"
#include "spanformer/train/family.h"
#include "spanformer/train/registry.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"
#include "spanformer/version.h"

namespace spanformer::train {

void export_safetensors(const Checkpoint& checkpoint, const std::string& path, const std::string& config_path) {
  auto family = family_from_checkpoint(checkpoint);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : family->module().named_parameters()) tensors.emplace_back(item.key(), item.value());
  auto config = family->config_json();
  config["arch"] = family->name();
  const std::map<std::string, std::string> metadata{
      {"format", "pt"},
      {"spanformer.family", family->name()},
      {"spanformer.config", config.dump()},
      {"spanformer.vocab", data::vocab_to_text(checkpoint.vocab())},
      {"spanformer.vocab_level", data::vocab_level(checkpoint.vocab())},
      {"spanformer.version", kVersion}};
  auto with_model = metadata;
  if (checkpoint.vocab().subwords) with_model["spanformer.vocab_model"] = hex_encode(checkpoint.vocab().subwords->proto());
  io::write_safetensors(path, tensors, with_model);
  write_file_atomic(config_path, config.dump(2) + "\n");
}

bool import_safetensors(const std::string& path, const std::string& checkpoint_path) {
  auto file = io::read_safetensors(path);
  for (const char* key : {"spanformer.family", "spanformer.config", "spanformer.vocab", "spanformer.vocab_level"})
    if (!file.metadata.count(key))
      fail("{} has no '{}' in its metadata: not written by `spanformer export safetensors`", path, key);
  nlohmann::json config;
  try {
    config = parse_json(file.metadata["spanformer.config"], path + ": its spanformer.config metadata");
  } catch (const nlohmann::json::exception& e) {
    fail("{}: its spanformer.config metadata is not JSON ({})", path, one_line_message(e));
  }
  if (config_arch(config, path) != file.metadata["spanformer.family"])
    fail("{}: its metadata names family '{}' but a config of arch '{}'", path, file.metadata["spanformer.family"],
         config_arch(config, path));
  const std::string& level = file.metadata["spanformer.vocab_level"];
  if (level != "byte" && level != "word" && level != "sentencepiece")
    fail("{}: vocab_level '{}' is not byte, word or sentencepiece", path, level);
  const std::string origin = path + " (metadata)";
  std::string subword_model;
  if (level == "sentencepiece") {
    if (!file.metadata.count("spanformer.vocab_model")) fail("{}: a sentencepiece vocabulary without spanformer.vocab_model", path);
    subword_model = hex_decode(file.metadata["spanformer.vocab_model"], origin);
  }
  auto vocab = data::vocab_from_parts(file.metadata["spanformer.vocab"], level, subword_model, origin);
  auto family = family_from_json(config, origin);
  family->set_vocab_size(vocab.size(), origin);
  family->validate();
  family->build();
  std::map<std::string, torch::Tensor> stored(file.tensors.begin(), file.tensors.end());
  torch::NoGradGuard no_grad;
  for (auto& item : family->module().named_parameters()) {
    auto it = stored.find(item.key());
    if (it == stored.end()) fail("{} has no tensor '{}', which the {} model needs", path, item.key(), family->name());
    const auto& t = it->second;
    if (!t.is_floating_point()) fail("{}: tensor '{}' is {}, not floating point", path, item.key(), c10::toString(t.scalar_type()));
    if (t.sizes() != item.value().sizes())
      fail("{}: tensor '{}' has shape {}, the model expects {}", path, item.key(), t.sizes(), item.value().sizes());
    if (!torch::isfinite(t).all().item<bool>()) fail("{}: tensor '{}' holds NaN or infinite values", path, item.key());
    item.value().copy_(t);
    stored.erase(it);
  }
  if (!stored.empty())
    fail("{} has tensor '{}', which the {} model does not have", path, stored.begin()->first, family->name());
  save_weights(*family, vocab, checkpoint_path);
  return file.checksummed;
}

}  // namespace spanformer::train
