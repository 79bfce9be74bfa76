#include "spanformer/io/xl_reference.h"

#include <ATen/ATen.h>

#include <map>

#include <fmt/ranges.h>

#include "spanformer/io/reference_import.h"
#include "spanformer/util/error.h"

namespace spanformer::io {
namespace {

constexpr const char* kExtraction =
    "torch.save(dict(torch.load('model.pt', map_location='cpu').state_dict()), 'state.pt'), in the reference's "
    "pytorch/ directory";
constexpr const char* kInvFreq = "pos_emb.inv_freq";

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> xl_reference_entries(models::xl::XlModel& model) {
  const auto& c = model->config();
  if (c.search) fail("a super-network (search) has no MemTransformerLM layout: derive a model first (spanformer par derive)");
  if (c.adapt_span) fail("MemTransformerLM has no adaptive span: the layout cannot hold a model with adapt_span");
  std::string plain;
  for (int64_t l = 0; l < c.n_layer; ++l) plain += "af";
  if (blocks_text(model->blocks()) != plain)
    fail("MemTransformerLM holds the block order (af)^n_layer; this model's is {}", blocks_text(model->blocks()));

  std::vector<std::pair<std::string, torch::Tensor>> out;
  auto add = [&](std::string name, const torch::Tensor& t) { out.emplace_back(std::move(name), t); };
  const auto& emb = *model->word_emb;
  for (size_t i = 0; i < emb.tables.size(); ++i) add(fmt::format("word_emb.emb_layers.{}.weight", i), emb.tables[i]);
  for (size_t i = 0; i < emb.projs.size(); ++i)
    if (emb.projs[i].defined()) add(fmt::format("word_emb.emb_projs.{}", i), emb.projs[i]);
  if (!c.untie_r) {
    add("r_w_bias", model->r_w_bias);
    add("r_r_bias", model->r_r_bias);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const auto& a = *model->attn[2 * l];
    const auto& f = *model->ff[2 * l + 1];
    const std::string attn = fmt::format("layers.{}.dec_attn.", l), ff = fmt::format("layers.{}.pos_ff.", l);
    if (c.untie_r) {
      add(attn + "r_w_bias", a.r_w_bias);
      add(attn + "r_r_bias", a.r_r_bias);
    }
    add(attn + "qkv_net.weight", a.qkv->weight);
    add(attn + "o_net.weight", a.o_net->weight);
    add(attn + "layer_norm.weight", a.norm->weight);
    add(attn + "layer_norm.bias", a.norm->bias);
    add(attn + "r_net.weight", a.r_net->weight);
    add(ff + "CoreNet.0.weight", f.fc1->weight);
    add(ff + "CoreNet.0.bias", f.fc1->bias);
    add(ff + "CoreNet.3.weight", f.fc2->weight);
    add(ff + "CoreNet.3.bias", f.fc2->bias);
    add(ff + "layer_norm.weight", f.norm->weight);
    add(ff + "layer_norm.bias", f.norm->bias);
  }
  const auto& crit = *model->crit;
  if (crit.cluster_weight.defined()) {
    add("crit.cluster_weight", crit.cluster_weight);
    add("crit.cluster_bias", crit.cluster_bias);
  }
  for (size_t i = 0; i < crit.weights.size(); ++i) {
    add(fmt::format("crit.out_layers.{}.weight", i), crit.weights[i]);
    add(fmt::format("crit.out_layers.{}.bias", i), crit.biases[i]);
  }
  for (size_t i = 0; i < crit.projs.size(); ++i)
    if (crit.projs[i].defined()) add(fmt::format("crit.out_projs.{}", i), crit.projs[i]);
  add(kInvFreq, models::xl::inv_freq(c.d_model));
  return out;
}

void load_xl_state_dict(models::xl::XlModel& model, const std::string& path) {
  auto expected = xl_reference_entries(model);
  std::map<std::string, torch::Tensor> file;
  for (auto [name, t] : read_state_dict(path, kExtraction)) {
    if (name.rfind("module.", 0) == 0) name = name.substr(7);
    file[name] = t;
  }
  std::map<const void*, std::string> first_name;  // our tensor -> the first reference name loaded into it
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : expected) {
    auto it = file.find(name);
    if (it == file.end()) fail("{}: missing tensor '{}'", path, name);
    const auto& t = it->second;
    if (t.sizes() != target.sizes())
      fail("{}: '{}' has shape {}, the config expects {}", path, name, fmt::join(t.sizes(), "x"),
           fmt::join(target.sizes(), "x"));
    if (!t.is_floating_point()) fail("{}: '{}' is not a floating-point tensor", path, name);
    if (name == kInvFreq) {
      if (!torch::allclose(t.to(torch::kDouble), target.to(torch::kDouble), 1e-5, 0))
        fail("{}: '{}' is not the sinusoid of d_model {}", path, name, model->config().d_model);
    } else if (auto [seen, fresh] = first_name.emplace(target.unsafeGetTensorImpl(), name); !fresh) {
      if (!torch::equal(t.to(target.dtype()), target))
        fail("{}: '{}' differs from '{}', which this config ties to it (tie_weight / tie_projs)", path, name,
             seen->second);
    } else {
      target.copy_(t);
    }
    file.erase(it);
  }
  if (!file.empty()) fail("{}: unexpected tensor '{}' (not part of this model config)", path, file.begin()->first);
}

void save_xl_state_dict(models::xl::XlModel& model, const std::string& path) {
  write_state_dict(xl_reference_entries(model), path);
}

}  // namespace spanformer::io
