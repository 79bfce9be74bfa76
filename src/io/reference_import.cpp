#include "spanformer/io/reference_import.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <fstream>
#include <map>
#include <regex>

#include <fmt/ranges.h>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::io {
namespace {

const char* kPrefix = "module.";

std::string mask_template_name(int64_t layer) {
  return fmt::format("{}layers.{}.attn.attn.adaptive_span._mask.mask_template", kPrefix, layer);
}

// Our tensor -> the reference's shape of it.
torch::Tensor to_reference_shape(const std::string& name, const torch::Tensor& t) {
  if (name == "key_pe") return t.unsqueeze(0);                                           // (1, D, L)
  if (name.find("span_ratio") != std::string::npos) return t.view({-1, 1, 1});          // (K, 1, 1)
  return t;
}

}  // namespace

std::string reference_name(const std::string& name) {
  static const std::vector<std::pair<std::regex, std::string>> rules = {
      {std::regex(R"(^layers\.(\d+)\.attn\.span\.span_ratio$)"), "layers.$1.attn.attn.adaptive_span._mask.current_val"},
      {std::regex(R"(^layers\.(\d+)\.attn\.pers_key$)"), "layers.$1.attn.attn.persistent_memory.key"},
      {std::regex(R"(^layers\.(\d+)\.attn\.pers_val$)"), "layers.$1.attn.attn.persistent_memory.val"},
      {std::regex(R"(^layers\.(\d+)\.(fc[12]\.(weight|bias))$)"), "layers.$1.ff.$2"},
  };
  for (const auto& [pattern, replacement] : rules) {
    if (std::regex_match(name, pattern)) return kPrefix + std::regex_replace(name, pattern, replacement);
  }
  return kPrefix + name;
}

void load_reference_state_dict(models::TransformerSeq& model, const std::string& path) {
  auto dict = read_state_dict(path, "torch.save(dict(torch.load(path, map_location='cpu')['model']), 'model.pt')");

  // Reference name -> our parameter.
  auto params = model->named_parameters();
  std::map<std::string, std::string> ours_by_reference;
  for (const auto& item : params) ours_by_reference[reference_name(item.key())] = item.key();
  const int64_t L = model->config().attn_span;

  std::map<std::string, bool> loaded;
  torch::NoGradGuard no_grad;
  for (auto [name, t] : dict) {
    if (name.rfind(kPrefix, 0) != 0) name = kPrefix + name;
    static const std::regex mask_template(R"(^module\.layers\.\d+\.attn\.attn\.adaptive_span\._mask\.mask_template$)");
    if (std::regex_match(name, mask_template)) {
      if (t.dim() != 1 || t.size(0) != L)
        fail("{}: '{}' has shape {}, the config's attn_span is {}", path, name, fmt::join(t.sizes(), "x"), L);
      continue;  // derivable
    }
    auto it = ours_by_reference.find(name);
    if (it == ours_by_reference.end()) fail("{}: unexpected tensor '{}' (not part of this model config)", path, name);
    auto* target = params.find(it->second);
    auto expected = to_reference_shape(it->second, *target);
    if (t.sizes() != expected.sizes())
      fail("{}: '{}' has shape {}, the config expects {}", path, name, fmt::join(t.sizes(), "x"),
           fmt::join(expected.sizes(), "x"));
    target->copy_(t.reshape(target->sizes()));
    loaded[it->second] = true;
  }
  for (const auto& item : params) {
    if (!loaded.count(item.key())) fail("{}: missing tensor '{}'", path, reference_name(item.key()));
  }
  model->sync_spans();
}

void save_reference_state_dict(models::TransformerSeq& model, const std::string& path) {
  std::vector<std::pair<std::string, torch::Tensor>> entries;
  for (const auto& item : model->named_parameters())
    entries.emplace_back(reference_name(item.key()), to_reference_shape(item.key(), item.value()));
  const int64_t L = model->config().attn_span;
  for (size_t l = 0; l < model->layers.size(); ++l) {
    if (model->layers[l]->attn->span)
      entries.emplace_back(mask_template_name(static_cast<int64_t>(l)), torch::linspace(1 - L, 0, L));
  }
  write_state_dict(entries, path);
}

std::vector<std::pair<std::string, torch::Tensor>> read_state_dict(const std::string& path, const std::string& extraction) {
  // The zip container first (every entry inside the file, every stored entry's CRC): LibTorch's zip reader
  // reads past its buffer on a damaged central directory (found by the `reference` fuzz target, kept in
  // tests/fuzz/crashes/reference/).
  if (const auto zip = zip_container_problem(path); !zip.zip) {
    fail("{} is not a readable state_dict (extract one in Python with: {})", path, extraction);
  } else if (!zip.what.empty()) {
    fail("{} is damaged: {}", path, zip.what);
  }
  std::string bytes = read_file(path);
  c10::IValue value;
  try {
    value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception&) {
    fail("{} is not a readable state_dict (extract one in Python with: {})", path, extraction);
  }
  if (!value.isGenericDict()) fail("{} does not hold a dict of tensors (extract one in Python with: {})", path, extraction);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) fail("{}: a key of the dict is not a string", path);
    if (!entry.value().isTensor()) fail("{}: '{}' is not a tensor", path, entry.key().toStringRef());
    out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  return out;
}

namespace {

// torch::pickle_save's file (the zip torch.save writes) without its type tags: pickle_save wraps every
// dict in torch.jit._pickle.restore_type_tag, a global that PyTorch 2.6 and later refuse to unpickle
// under torch.load's default weights_only=True. Untagged, the file is a plain dict of tensors that
// every torch.load (1.x and 2.x, weights_only or not) reads.
std::vector<char> pickle_untagged(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickled.insert(pickled.end(), data, data + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> zip;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      zip.insert(zip.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  }  // the writer's destructor writes the zip's directory
  return zip;
}

}  // namespace

void write_state_dict(const std::vector<std::pair<std::string, torch::Tensor>>& entries, const std::string& path) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : entries) dict.insert(name, t.detach().cpu().contiguous());
  std::vector<char> bytes = pickle_untagged(c10::IValue(dict));
  write_atomic_with(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) fail("cannot write {}", path);
  });
}

}  // namespace spanformer::io
