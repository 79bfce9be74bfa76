#include "spanformer/train/checkpoint.h"

#include <fmt/ranges.h>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::train {

void save_checkpoint(const std::string& path, const Config& config, const data::Vocab& vocab,
                     models::TransformerSeq& model, const Optimizer* optimizer, const TrainState* state) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kCheckpointFormat)));
  archive.write("config", c10::IValue(to_json(config).dump()));
  archive.write("vocab", c10::IValue(data::vocab_to_text(vocab)));
  for (const auto& item : model->named_parameters()) archive.write("model." + item.key(), item.value().detach());
  if (optimizer) optimizer->save(archive, "optim.");
  if (state) {
    archive.write("state.step", torch::tensor(state->step));
    archive.write("state.train_pos", torch::tensor(state->train_pos));
    archive.write("state.valid_pos", torch::tensor(state->valid_pos));
    archive.write("state.elapsed_seconds", torch::tensor(state->elapsed_seconds, torch::kDouble));
    archive.write("state.nb_caches", torch::tensor(static_cast<int64_t>(state->train_caches.size())));
    for (size_t l = 0; l < state->train_caches.size(); ++l) {
      archive.write(fmt::format("state.train_cache.{}", l), state->train_caches[l].contiguous());
      archive.write(fmt::format("state.valid_cache.{}", l), state->valid_caches[l].contiguous());
    }
    archive.write("state.rng", state->rng_state);
    if (state->cuda_rng_state.defined()) archive.write("state.cuda_rng", state->cuda_rng_state);
  }
  write_atomic_with(path, [&](const std::string& tmp) { archive.save_to(tmp); });
}

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  if (!file_exists(path)) fail("checkpoint not found: {}", path);
  try {
    archive_.load_from(path);
  } catch (const std::exception&) {
    fail("{} is not a readable spanformer checkpoint (truncated, corrupt, or another format)", path);
  }
  c10::IValue format, config_text, vocab_text;
  if (archive_.try_read("format", format) && format.isString() && format.toStringRef() == "spanformer-xl-checkpoint-v1")
    fail("{} is a Transformer-XL/PAR checkpoint: this command works with adaptive-span checkpoints", path);
  if (!archive_.try_read("format", format) || !format.isString() || format.toStringRef() != kCheckpointFormat)
    fail("{} is not a spanformer checkpoint (no '{}' marker; reference models need `spanformer import`)", path,
         kCheckpointFormat);
  archive_.read("config", config_text);
  archive_.read("vocab", vocab_text);
  config_ = config_from_json(nlohmann::json::parse(config_text.toStringRef()), path);
  vocab_.tokens = vocab_lines(vocab_text.toStringRef());
}

std::vector<std::string> vocab_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

void read_parameters(torch::serialize::InputArchive& archive, const std::string& path,
                     const torch::OrderedDict<std::string, torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  for (const auto& item : params) {
    torch::Tensor t;
    if (!archive.try_read("model." + item.key(), t)) fail("checkpoint {} has no parameter '{}'", path, item.key());
    if (t.sizes() != item.value().sizes())
      fail("checkpoint {}: parameter '{}' has shape {}, the model expects {}", path, item.key(),
           fmt::join(t.sizes(), "x"), fmt::join(item.value().sizes(), "x"));
    item.value().copy_(t);
  }
}

bool CheckpointReader::has_train_state() {
  torch::Tensor t;
  return archive_.try_read("state.step", t);
}

std::string model_config_difference(const ModelConfig& a, const ModelConfig& b) {
  auto ja = to_json(a), jb = to_json(b);
  for (const auto& [key, value] : ja.items()) {
    if (key == "attn_impl") continue;  // how attention is computed, not what the model is
    if (jb[key] != value) return fmt::format("{} {} vs {}", key, value.dump(), jb[key].dump());
  }
  return "";
}

models::TransformerSeq CheckpointReader::load_model(const std::string& attn_impl) {
  ModelConfig config = config_.model;
  if (!attn_impl.empty()) config.attn_impl = attention::parse_attn_impl(attn_impl);
  validate(config);
  models::TransformerSeq model(config);
  load_model_into(model);
  return model;
}

void CheckpointReader::load_model_into(models::TransformerSeq& model) {
  auto diff = model_config_difference(model->config(), config_.model);
  if (!diff.empty()) fail("checkpoint {} is for another model: {} (checkpoint vs config)", path_, diff);
  read_parameters(archive_, path_, model->named_parameters());
  model->sync_spans();
}

void CheckpointReader::load_optimizer(Optimizer& optimizer) { optimizer.load(archive_, "optim."); }

TrainState CheckpointReader::load_state(int64_t nb_layers) {
  TrainState state;
  auto read_int = [&](const char* key) {
    torch::Tensor t;
    if (!archive_.try_read(key, t)) fail("checkpoint {} has no training state ('{}'); it cannot be resumed", path_, key);
    return t.item<int64_t>();
  };
  state.step = read_int("state.step");
  state.train_pos = read_int("state.train_pos");
  state.valid_pos = read_int("state.valid_pos");
  if (read_int("state.nb_caches") != nb_layers) fail("checkpoint {} holds caches for another number of layers", path_);
  torch::Tensor elapsed;
  archive_.read("state.elapsed_seconds", elapsed);
  state.elapsed_seconds = elapsed.item<double>();
  for (int64_t l = 0; l < nb_layers; ++l) {
    torch::Tensor train_cache, valid_cache;
    archive_.read(fmt::format("state.train_cache.{}", l), train_cache);
    archive_.read(fmt::format("state.valid_cache.{}", l), valid_cache);
    state.train_caches.push_back(train_cache);
    state.valid_caches.push_back(valid_cache);
  }
  archive_.read("state.rng", state.rng_state);
  archive_.try_read("state.cuda_rng", state.cuda_rng_state);
  return state;
}

}  // namespace spanformer::train
