// Hugging Face's GPT-2 layout (transformers' GPT2LMHeadModel: save_pretrained / from_pretrained), both
// ways, for the gpt family (io/gpt2.h).
//
// A directory: config.json (GPT2Config), model.safetensors (the state dict) and the tokens: vocab.txt,
// written by spanformer for its byte and word vocabularies, or GPT-2's byte-level BPE tokenizer
// (tokenizer.json, or vocab.json + merges.txt, as transformers' tokenizer saves them: data/byte_bpe.h),
// which import keeps, so that generate takes and prints text as transformers does. The model is the same
// function when ours is what GPT-2 can express: dense causal attention (or flash, the same function),
// learned positions, standard residual layers, LayerNorm eps 1e-5, GELU exact ("gelu") or tanh
// ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"). GPT-2's Conv1D layers store weight (in, out), the
// transpose of a Linear's (out, in):
//   wte, wpe, ln_f                  transformer.wte / wpe / ln_f
//   blocks.l.ln1, ln2               transformer.h.l.ln_1, ln_2
//   blocks.l.attn.qkv (3H, H)       transformer.h.l.attn.c_attn (H, 3H): q, k, v, each head after head
//   blocks.l.attn.proj              transformer.h.l.attn.c_proj (transposed)
//   blocks.l.fc1, fc2               transformer.h.l.mlp.c_fc, c_proj (transposed)
//   head (untied only)              lm_head (V, H), not transposed
#include "spanformer/io/gpt2.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/config/gpt_config.h"
#include "spanformer/data/byte_bpe.h"
#include "spanformer/data/corpus.h"
#include "spanformer/io/safetensors.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/family.h"
#include "spanformer/train/registry.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"

namespace spanformer::io {
namespace {

struct Gpt2Tensor {
  std::string ours, theirs;
  bool transposed;
};

std::vector<Gpt2Tensor> gpt2_tensors(const GptModelConfig& c) {
  std::vector<Gpt2Tensor> out = {{"wte.weight", "transformer.wte.weight", false},
                                 {"wpe.weight", "transformer.wpe.weight", false}};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string a = fmt::format("blocks.{}.", l), b = fmt::format("transformer.h.{}.", l);
    for (const char* p : {"weight", "bias"}) {
      out.push_back({a + "ln1." + p, b + "ln_1." + p, false});
      out.push_back({a + "attn.qkv." + p, b + "attn.c_attn." + p, p[0] == 'w'});
      out.push_back({a + "attn.proj." + p, b + "attn.c_proj." + p, p[0] == 'w'});
      out.push_back({a + "ln2." + p, b + "ln_2." + p, false});
      out.push_back({a + "fc1." + p, b + "mlp.c_fc." + p, p[0] == 'w'});
      out.push_back({a + "fc2." + p, b + "mlp.c_proj." + p, p[0] == 'w'});
    }
  }
  out.push_back({"ln_f.weight", "transformer.ln_f.weight", false});
  out.push_back({"ln_f.bias", "transformer.ln_f.bias", false});
  if (!c.tie_weights) out.push_back({"head.weight", "lm_head.weight", false});
  return out;
}

// What GPT-2 cannot express, as the one-line reason ("" when the model fits the layout).
std::string outside_gpt2(const GptModelConfig& c) {
  if (c.attention != attention::CausalKind::kDense && c.attention != attention::CausalKind::kFlash)
    return fmt::format("GPT-2 has dense attention only, and this model's attention is {}",
                       attention::causal_kind_name(c.attention));
  if (c.positions != Positions::kLearned) return "GPT-2 has learned positions, and this model's are sinusoidal";
  if (c.reversible) return "GPT-2 has standard residual layers, and this model's are reversible";
  return "";
}

int64_t eos_id(const data::Vocab& vocab) {
  for (size_t i = 0; i < vocab.tokens.size(); ++i)
    if (vocab.tokens[i] == data::kEos) return static_cast<int64_t>(i);
  return -1;
}

template <typename T>
T hf_field(const nlohmann::json& config, const char* key, const std::string& origin) {
  if (!config.contains(key)) fail("{}: no '{}' (a GPT2Config has it)", origin, key);
  if constexpr (std::is_integral_v<T>) {  // nlohmann would truncate 2.5 to 2 without a word
    if (!config[key].is_number_integer()) fail("{}: '{}' is {}, not an integer", origin, key, config[key].dump());
  }
  try {
    return config[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("{}: '{}' is {}, of the wrong type", origin, key, config[key].dump());
  }
}

}  // namespace

void export_gpt2(const train::Checkpoint& checkpoint, const std::string& dir) {
  auto family = train::family_from_checkpoint(checkpoint);
  if (std::string(family->name()) != "gpt")
    fail("export gpt2: {} is of the {} family; the GPT-2 layout is for the gpt family (export safetensors keeps any)",
         checkpoint.path(), family->name());
  const auto c = gpt_config_from_json(family->config_json(), checkpoint.path()).model;
  if (const auto why = outside_gpt2(c); !why.empty()) fail("export gpt2: {} (export safetensors keeps it)", why);
  const auto& vocab = checkpoint.vocab();
  if (vocab.subwords) fail("export gpt2: a SentencePiece vocabulary does not travel in the GPT-2 layout (byte, word and BPE ones do)");
  if (file_exists(dir)) fail("export gpt2: {} is a file; the GPT-2 layout is a directory (config.json, model.safetensors)", dir);
  make_dirs(dir);
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : family->module().named_parameters()) params[item.key()] = item.value().detach();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& t : gpt2_tensors(c)) {
    const auto& p = params.at(t.ours);
    tensors.emplace_back(t.theirs, t.transposed ? p.t().contiguous() : p);  // Conv1D: (in, out)
  }
  const int64_t eos = vocab.bpe ? vocab.bpe->end_of_text() : eos_id(vocab);
  const std::string vocab_file = vocab.bpe ? "tokenizer.json" : "vocab.txt";
  const std::string vocab_text = vocab.bpe ? vocab.bpe->source() : data::vocab_to_text(vocab);
  auto config = family->config_json();
  config["arch"] = family->name();
  const nlohmann::json hf = {
      {"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", c.vocab_size},
      {"n_positions", c.context}, {"n_embd", c.d_model}, {"n_layer", c.n_layer}, {"n_head", c.n_head},
      {"n_inner", c.d_inner > 0 ? nlohmann::json(c.d_inner) : nlohmann::json()},
      {"activation_function", c.activation == Activation::kGeluTanh ? "gelu_new" : "gelu"},
      {"resid_pdrop", c.dropout}, {"embd_pdrop", c.dropout}, {"attn_pdrop", c.attn_dropout},
      {"layer_norm_epsilon", 1e-5}, {"initializer_range", c.init_std}, {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false}, {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", c.tie_weights},
      {"bos_token_id", eos >= 0 ? nlohmann::json(eos) : nlohmann::json()},
      {"eos_token_id", eos >= 0 ? nlohmann::json(eos) : nlohmann::json()},
      {"spanformer_vocab_level", data::vocab_level(vocab)}, {"spanformer_config", config},
      {"spanformer_vocab_sha256", data::vocab_checksum(vocab_text)}};
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomic(dir + "/" + vocab_file, vocab_text);
  write_file_atomic(dir + "/config.json", hf.dump(2) + "\n");
}

bool import_gpt2(const std::string& dir, const std::string& vocab_path, const std::string& vocab_level,
                 const std::string& checkpoint_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail("import gpt2: {} is not a directory: give the one save_pretrained (or export gpt2) wrote, with config.json "
         "and model.safetensors", dir);
  const std::string config_path = dir + "/config.json", weights = dir + "/model.safetensors";
  if (!file_exists(config_path)) fail("import gpt2: {} has no config.json", dir);
  if (!file_exists(weights)) {
    if (file_exists(dir + "/model.safetensors.index.json"))
      fail("import gpt2: {} holds a sharded checkpoint, which is not read (save it with a larger max_shard_size)", dir);
    fail("import gpt2: {} has no model.safetensors (save_pretrained writes it by default; pytorch_model.bin is not read)", dir);
  }
  // Read as our own configs are: a key given twice in one object is refused, not the last one taken.
  const nlohmann::json hf = read_config_file(config_path);
  if (!hf.is_object()) fail("{}: not a JSON object", config_path);
  if (hf.value("model_type", std::string("gpt2")) != "gpt2")
    fail("{}: a '{}' model, not gpt2", config_path, hf["model_type"].is_string() ? hf["model_type"].get<std::string>() : hf["model_type"].dump());
  if (!hf.value("scale_attn_weights", true)) fail("{}: scale_attn_weights is false; spanformer scales scores by 1/sqrt(D)", config_path);
  if (hf.value("scale_attn_by_inverse_layer_idx", false)) fail("{}: scale_attn_by_inverse_layer_idx is not supported", config_path);
  if (hf.value("add_cross_attention", false)) fail("{}: add_cross_attention (an encoder-decoder GPT-2) is not supported", config_path);
  if (std::abs(hf.value("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-15)
    fail("{}: layer_norm_epsilon {} (spanformer's LayerNorm has 1e-5)", config_path, hf["layer_norm_epsilon"].dump());
  const std::string act = hf.value("activation_function", std::string("gelu_new"));
  if (act != "gelu" && act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    fail("{}: activation_function '{}' (gelu, gelu_new, gelu_pytorch_tanh or gelu_fast are read)", config_path, act);

  nlohmann::json config = hf.contains("spanformer_config") && hf["spanformer_config"].is_object()
                              ? hf["spanformer_config"] : nlohmann::json{{"arch", "gpt"}};
  if (config.value("arch", std::string("gpt")) != "gpt") fail("{}: spanformer_config is not a gpt config", config_path);
  config["arch"] = "gpt";
  auto& model = config["model"];
  const bool flash = model.is_object() && model.value("attention", std::string()) == "flash";
  model = nlohmann::json::object();
  model["vocab_size"] = hf_field<int64_t>(hf, "vocab_size", config_path);
  model["n_layer"] = hf_field<int64_t>(hf, "n_layer", config_path);
  model["n_head"] = hf_field<int64_t>(hf, "n_head", config_path);
  model["d_model"] = hf_field<int64_t>(hf, "n_embd", config_path);
  model["d_inner"] = hf.contains("n_inner") && !hf["n_inner"].is_null() ? hf_field<int64_t>(hf, "n_inner", config_path) : 0;
  model["context"] = hf_field<int64_t>(hf, "n_positions", config_path);
  model["positions"] = "learned";
  model["activation"] = act == "gelu" ? "gelu" : "gelu_tanh";
  model["tie_weights"] = hf.value("tie_word_embeddings", true);
  auto& run = config["run"];
  if (!run.is_object()) run = nlohmann::json::object();
  run["dropout"] = hf.value("resid_pdrop", 0.1);
  run["attn_dropout"] = hf.value("attn_pdrop", 0.1);
  model["init_std"] = hf.value("initializer_range", 0.02);
  model["attention"] = flash ? "flash" : "dense";

  data::Vocab vocab;
  if (!vocab_path.empty()) {
    vocab = vocab_level == "word" ? data::read_word_vocab(vocab_path) : data::read_vocab(vocab_path);
  } else if (file_exists(dir + "/vocab.txt")) {
    const std::string level = hf.value("spanformer_vocab_level", std::string("byte"));
    if (level != "byte" && level != "word") fail("{}: spanformer_vocab_level '{}' is not byte or word", config_path, level);
    const std::string text = read_file(dir + "/vocab.txt");
    // export gpt2 records the vocabulary's checksum in config.json: two lines swapped would map ids to
    // other tokens without a word. A directory without one (written elsewhere) is taken as it is, said once.
    if (hf.contains("spanformer_vocab_sha256")) {
      if (!hf["spanformer_vocab_sha256"].is_string() || hf["spanformer_vocab_sha256"].get<std::string>() != data::vocab_checksum(text))
        fail("import gpt2: {}/vocab.txt does not match the spanformer_vocab_sha256 in config.json (edited after export: "
             "ids would map to other tokens)", dir);
    } else {
      fmt::print(stderr, "spanformer: note: {}/vocab.txt carries no checksum (config.json has no spanformer_vocab_sha256): "
                 "its tokens are taken as they are\n", dir);
    }
    vocab = data::vocab_from_parts(text, level, "", dir + "/vocab.txt");
  } else if (file_exists(dir + "/tokenizer.json") || (file_exists(dir + "/vocab.json") && file_exists(dir + "/merges.txt"))) {
    auto bpe = data::load_byte_bpe(dir);  // GPT-2's own tokenizer, as transformers saved it
    if (hf.contains("spanformer_vocab_sha256") && hf.value("spanformer_vocab_level", std::string()) == "bpe" &&
        (!hf["spanformer_vocab_sha256"].is_string() || hf["spanformer_vocab_sha256"].get<std::string>() != data::vocab_checksum(bpe->source())))
      fail("import gpt2: {}/tokenizer.json does not match the spanformer_vocab_sha256 in config.json (edited after export: "
           "ids would map to other tokens)", dir);
    vocab = data::bpe_vocab(std::move(bpe));
  } else {
    fail("import gpt2: {} has neither vocab.txt nor GPT-2's tokenizer (tokenizer.json, or vocab.json + merges.txt): give "
         "--vocab (the token of every id, a byte value or <eos> per line)", dir);
  }
  auto family = train::family_from_json(config, config_path);
  family->set_vocab_size(vocab.size(), vocab_path.empty() ? dir + "/vocab.txt" : vocab_path);
  family->validate();
  family->build();
  const auto c = gpt_config_from_json(family->config_json(), config_path).model;
  auto file = read_safetensors(weights);
  std::map<std::string, torch::Tensor> stored;
  for (auto& [name, t] : file.tensors) {
    std::string key = name;
    if (key.rfind("transformer.", 0) != 0 && key.rfind("lm_head.", 0) != 0) key = "transformer." + key;  // GPT2Model
    const auto ends_with = [&](const std::string& tail) {
      return key.size() >= tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) continue;  // older transformers' causal-mask buffers
    stored[key] = t;
  }
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : family->module().named_parameters()) params[item.key()] = item.value();
  torch::NoGradGuard no_grad;
  for (const auto& name : gpt2_tensors(c)) {
    auto it = stored.find(name.theirs);
    if (it == stored.end()) fail("{} has no tensor '{}', which this GPT-2 needs", weights, name.theirs);
    auto t = name.transposed ? it->second.t() : it->second;
    auto& p = params.at(name.ours);
    if (!t.is_floating_point()) fail("{}: tensor '{}' is {}, not floating point", weights, name.theirs, c10::toString(t.scalar_type()));
    if (t.sizes() != p.sizes())
      fail("{}: tensor '{}' has shape {}, config.json implies {}", weights, name.theirs, it->second.sizes(),
           name.transposed ? p.t().sizes() : p.sizes());
    if (!torch::isfinite(t).all().item<bool>()) fail("{}: tensor '{}' holds NaN or infinite values", weights, name.theirs);
    p.copy_(t);
    stored.erase(it);
  }
  if (auto it = stored.find("lm_head.weight"); it != stored.end() && c.tie_weights) {
    if (!torch::equal(it->second.to(torch::kFloat), params.at("wte.weight")))
      fail("{}: lm_head.weight differs from transformer.wte.weight, but tie_word_embeddings is true", weights);
    stored.erase(it);
  }
  if (!stored.empty()) fail("{} has tensor '{}', which a GPT-2 of this config does not have", weights, stored.begin()->first);
  train::save_weights(*family, vocab, checkpoint_path);
  return file.checksummed;
}

}  // namespace spanformer::io
