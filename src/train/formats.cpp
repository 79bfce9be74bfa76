// The weight formats table and the safetensors conversions, the same for every family (train/formats.h).
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <map>

#include <fmt/format.h>

#include "spanformer/data/corpus.h"
#include "spanformer/data/subwords.h"
#include "spanformer/io/gpt2.h"
#include "spanformer/io/safetensors.h"
#include "spanformer/train/family.h"
#include "spanformer/train/formats.h"
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
  if (!checkpoint.vocab().model_bytes().empty()) with_model["spanformer.vocab_model"] = hex_encode(checkpoint.vocab().model_bytes());
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
  if (level != "byte" && level != "word" && level != "sentencepiece" && level != "bpe")
    fail("{}: vocab_level '{}' is not byte, word, sentencepiece or bpe", path, level);
  const std::string origin = path + " (metadata)";
  std::string subword_model;
  if (level == "sentencepiece" || level == "bpe") {
    if (!file.metadata.count("spanformer.vocab_model")) fail("{}: a {} vocabulary without spanformer.vocab_model", path, level);
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

std::string config_path_beside(const std::string& weights_path) {
  const std::string suffix = ".safetensors";
  const bool has_suffix = weights_path.size() > suffix.size() &&
                          weights_path.compare(weights_path.size() - suffix.size(), suffix.size(), suffix) == 0;
  return (has_suffix ? weights_path.substr(0, weights_path.size() - suffix.size()) : weights_path) + ".json";
}

namespace {

std::string unchecked_note(const std::string& file) {
  return fmt::format("{} carries no {} checksum (not written by spanformer, or edited): its tensors are taken as "
                     "they are", file, io::kSafetensorsChecksumKey);
}

// A reference implementation's state_dict: the model from --config and --vocab, the tensors through the
// family's ReferenceWeights capability.
WeightFormat reference_format(const std::string& name, const std::string& reads, const std::string& writes) {
  WeightFormat f{name, reads, writes, nullptr, nullptr};
  f.import_weights = [name](const ImportRequest& r) {
    if (has_checkpoint_marker(r.model))
      fail("import {}: {} is a spanformer checkpoint already (import reads the reference's state_dict)", name, r.model);
    if (r.config.empty() || r.vocab.empty()) fail("import {}: --config and --vocab are required", name);
    auto family = family_from_config_file(r.config, r.overrides);
    auto vocab = r.vocab_level == "word" ? data::read_word_vocab(r.vocab) : data::read_vocab(r.vocab);
    family->set_vocab_size(vocab.size(), r.vocab);
    family->validate();
    family->build();
    family->need<ReferenceWeights>("import from " + name).import_weights(name, r.model);
    save_weights(*family, vocab, r.out);
    ImportResult result;
    if (const auto* spans = family->as<Spans>()) result.spans = spans->spans();
    return result;
  };
  f.export_weights = [name](const Checkpoint& checkpoint, const std::string& out) {
    auto family = family_from_checkpoint(checkpoint);
    family->need<ReferenceWeights>("export to " + name).export_weights(name, out);
    return std::string("(load in Python with model.load_state_dict(torch.load(path)))");
  };
  return f;
}

}  // namespace

const std::vector<WeightFormat>& weight_formats() {
  static const std::vector<WeightFormat> formats = [] {
    std::vector<WeightFormat> v;
    v.push_back({"safetensors", "written by `spanformer export safetensors`, any family",
                 "every family: Hugging Face's format, config JSON beside it",
                 [](const ImportRequest& r) {
                   if (!r.config.empty() || !r.vocab.empty() || !r.overrides.empty())
                     fail("import safetensors: the file carries its config and vocabulary; --config, --vocab and "
                          "overrides are not used");
                   ImportResult result;
                   if (!import_safetensors(r.model, r.out)) result.note = unchecked_note(r.model);
                   return result;
                 },
                 [](const Checkpoint& checkpoint, const std::string& out) {
                   const std::string config = config_path_beside(out);
                   export_safetensors(checkpoint, out, config);
                   return "(config: " + config + ")";
                 }});
    v.push_back({"gpt2", "a directory transformers' save_pretrained wrote for a GPT2LMHeadModel",
                 "a gpt model as Hugging Face transformers' GPT2LMHeadModel: a directory",
                 [](const ImportRequest& r) {
                   if (!r.config.empty() || !r.overrides.empty())
                     fail("import gpt2: the directory's config.json describes the model; --config and overrides are "
                          "not used");
                   ImportResult result;
                   if (!io::import_gpt2(r.model, r.vocab, r.vocab_level, r.out))
                     result.note = unchecked_note(r.model + "/model.safetensors");
                   return result;
                 },
                 [](const Checkpoint& checkpoint, const std::string& out) {
                   io::export_gpt2(checkpoint, out);
                   return "(transformers: GPT2LMHeadModel.from_pretrained(\"" + out + "\"))";
                 }});
    v.push_back(reference_format("adaptive-span", "facebookresearch/adaptive-span's state_dict",
                                 "a state_dict the Python reference loads"));
    v.push_back(reference_format("transformer-xl", "kimiyoung/transformer-xl's MemTransformerLM state_dict",
                                 "a state_dict the Python reference loads"));
    return v;
  }();
  return formats;
}

const WeightFormat* find_weight_format(const std::string& name) {
  for (const auto& f : weight_formats())
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<std::string> weight_format_names() {
  std::vector<std::string> names;
  for (const auto& f : weight_formats()) names.push_back(f.name);
  return names;
}

}  // namespace spanformer::train
