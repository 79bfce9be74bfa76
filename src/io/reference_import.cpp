#include "spanformer/io/reference_import.h"

#include <torch/serialize.h>

#include <map>
#include <regex>
#include <set>

#include <fmt/ranges.h>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::io {
namespace {

// Reference name -> spanformer name ("" = ignored buffer).
std::string map_name(std::string name) {
  if (name.rfind("module.", 0) == 0) name = name.substr(7);
  static const std::vector<std::pair<std::regex, std::string>> rules = {
      {std::regex(R"(^layers\.(\d+)\.attn\.attn\.adaptive_span\._mask\.current_val$)"), "layers.$1.attn.span.span_ratio"},
      {std::regex(R"(^layers\.(\d+)\.attn\.attn\.adaptive_span\._mask\.mask_template$)"), ""},
      {std::regex(R"(^layers\.(\d+)\.attn\.attn\.persistent_memory\.key$)"), "layers.$1.attn.pers_key"},
      {std::regex(R"(^layers\.(\d+)\.attn\.attn\.persistent_memory\.val$)"), "layers.$1.attn.pers_val"},
      {std::regex(R"(^layers\.(\d+)\.ff\.(fc[12]\.(weight|bias))$)"), "layers.$1.$2"},
  };
  for (const auto& [pattern, replacement] : rules) {
    if (std::regex_match(name, pattern)) return std::regex_replace(name, pattern, replacement);
  }
  return name;
}

}  // namespace

void load_reference_state_dict(models::TransformerSeq& model, const std::string& path) {
  std::string bytes = read_file(path);
  c10::IValue value;
  try {
    value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception&) {
    fail("{} is not a readable state_dict (extract it with: torch.save(dict(torch.load(path, map_location='cpu')['model']), 'model.pt'))", path);
  }
  if (!value.isGenericDict()) fail("{} does not hold a dict of tensors", path);
  auto params = model->named_parameters();
  std::set<std::string> seen;
  torch::NoGradGuard no_grad;
  for (const auto& entry : value.toGenericDict()) {
    const std::string ref_name = entry.key().toStringRef();
    const std::string name = map_name(ref_name);
    if (name.empty()) continue;
    if (!entry.value().isTensor()) fail("{}: '{}' is not a tensor", path, ref_name);
    auto* target = params.find(name);
    if (!target) fail("{}: unexpected tensor '{}' (not part of this model config)", path, ref_name);
    auto t = entry.value().toTensor();
    if (name == "key_pe" && t.dim() == 3) t = t.squeeze(0);                        // (1, D, L) -> (D, L)
    if (name.find("span_ratio") != std::string::npos) t = t.reshape({-1});        // (K, 1, 1) -> (K)
    if (t.sizes() != target->sizes())
      fail("{}: '{}' has shape {}, the config expects {}", path, ref_name, fmt::join(t.sizes(), "x"),
           fmt::join(target->sizes(), "x"));
    target->copy_(t);
    seen.insert(name);
  }
  for (const auto& item : params) {
    if (!seen.count(item.key())) fail("{}: missing tensor for '{}'", path, item.key());
  }
  model->sync_spans();
}

}  // namespace spanformer::io
