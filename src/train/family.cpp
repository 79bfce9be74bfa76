#include "spanformer/train/family.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <random>
#include <sstream>

#include <fmt/format.h>

#include "families/families.h"
#include "spanformer/dist/group.h"
#include "spanformer/dist/reducer.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"

namespace spanformer::train {

void StepContext::before_last_backward() const {
  if (reducer) reducer->arm();  // this backward completes the gradients: buckets reduce as they fill
}

void StepContext::reduce_gradients(const std::vector<torch::Tensor>& params) const {
  if (reducer) {
    reducer->finish();
  } else if (group) {
    // Every rank's loss is a mean over its equal share of the streams: the mean of the ranks'
    // gradients is the gradient of the global batch. One bucket, one all-reduce.
    std::vector<torch::Tensor> grads;
    for (const auto& p : params)
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
    group->all_reduce_mean(grads);
  }
}

void Family::load_weights(const Checkpoint& in) {
  if (in.family() != name())
    fail("checkpoint {} is a {} model, not {}", in.path(), in.family(), name());
  auto diff = model_difference(in.config());
  if (!diff.empty()) fail("checkpoint {} is for another model: {} (config vs checkpoint)", in.path(), diff);
  in.read_parameters(module().named_parameters());
}

void Family::sample(const data::Vocab&, const SampleRequest&) { unsupported("generation"); }
void Family::import_weights(const std::string& kind, const std::string&) { unsupported("import from " + kind); }
void Family::export_weights(const std::string& kind, const std::string&) { unsupported("export to " + kind); }

void save_weights(Family& family, const data::Vocab& vocab, const std::string& path) {
  CheckpointWriter out(family.name(), family.config_json(), vocab);
  for (const auto& item : family.module().named_parameters()) out.put("model." + item.key(), item.value());
  out.save(path);
}

void Family::fill_vocab_size(int64_t& vocab_size, int64_t V, const std::string& origin) {
  if (vocab_size == 0) vocab_size = V;
  if (vocab_size != V) fail("config vocab_size {} does not match the vocabulary of {} ({} tokens)", vocab_size, origin, V);
}

void Family::unsupported(const std::string& what) const { fail("the {} family has no {}", name(), what); }

namespace {

std::unique_ptr<Family> make_family(const std::string& arch, const nlohmann::json& config, const std::string& origin,
                                    const std::vector<std::string>& overrides) {
  if (arch == "adaptive-span") return make_adaptive_span_family(config, origin, overrides);
  if (arch == "xl") return make_xl_family(config, origin, overrides);
  fail("{}: unknown arch '{}' (adaptive-span or xl)", origin, arch);
}

std::string arch_of(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) fail("{}: a config must be a JSON object", origin);
  if (!j.contains("arch")) return "adaptive-span";
  if (!j["arch"].is_string()) fail("{}: arch must be a string (adaptive-span or xl)", origin);
  return j["arch"].get<std::string>();
}

}  // namespace

std::unique_ptr<Family> family_from_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  if (!file_exists(path)) fail("file not found: {}", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    fail("{} is not valid JSON: {}", path, e.what());
  }
  return make_family(arch_of(j, path), j, path, overrides);
}

std::unique_ptr<Family> family_from_json(const nlohmann::json& config, const std::string& origin,
                                         const std::vector<std::string>& overrides) {
  return make_family(arch_of(config, origin), config, origin, overrides);
}

std::unique_ptr<Family> family_from_checkpoint(const Checkpoint& checkpoint, const std::vector<std::string>& overrides) {
  auto family = make_family(checkpoint.family(), checkpoint.config(), checkpoint.path(), overrides);
  family->validate();
  family->build();
  family->load_weights(checkpoint);  // refuses overrides that change the model
  return family;
}

torch::Device parse_device(const std::string& name) {
  try {
    torch::Device device(name);
    if (device.is_cuda() && !torch::cuda::is_available())
      fail("device '{}' asked for, but no CUDA device is available to this LibTorch build", name);
    return device;
  } catch (const c10::Error&) {
    fail("unknown device '{}' (cpu, cuda or cuda:N)", name);
  }
}

std::vector<int64_t> prompt_ids(const data::Vocab& vocab, const std::string& prompt) {
  std::vector<int64_t> ids;
  if (vocab.word_level) {
    int64_t unk = -1, eos = -1;
    std::unordered_map<std::string, int64_t> index;
    for (int64_t i = 0; i < vocab.size(); ++i) {
      index[vocab.tokens[i]] = i;
      if (vocab.tokens[i] == "<unk>") unk = i;
      if (vocab.tokens[i] == "<eos>") eos = i;
    }
    std::istringstream in(prompt);
    std::string word;
    while (in >> word) {
      auto it = index.find(word);
      if (it != index.end()) ids.push_back(it->second);
      else if (unk >= 0) ids.push_back(unk);
    }
    if (ids.empty()) ids.push_back(eos >= 0 ? eos : 0);
    return ids;
  }
  const auto byte_to_id = vocab.byte_to_id();
  for (unsigned char c : prompt)
    if (byte_to_id[c] >= 0) ids.push_back(byte_to_id[c]);
  if (ids.empty()) ids.push_back(byte_to_id['\n'] >= 0 ? byte_to_id['\n'] : 0);  // start from <eos>
  return ids;
}

void set_bimodal_spans(const std::vector<torch::Tensor>& span_ratios, double L) {
  std::mt19937 rng(1);
  torch::NoGradGuard no_grad;
  for (auto r : span_ratios) {
    for (int64_t h = 0; h < r.size(0); ++h) {
      const double z = h % 4 == 3 ? std::uniform_real_distribution<double>(std::min(2048.0, L), L)(rng)
                                  : std::uniform_real_distribution<double>(16.0, std::min(256.0, L))(rng);
      r[h] = z / L;
    }
  }
}

double time_steps(const BenchRequest& r, const std::function<void()>& step) {
  if (r.steps < 1 || r.warmup < 0) fail("--steps must be >= 1 and --warmup >= 0");
  double total = 0;
  for (int64_t i = 0; i < r.warmup + r.steps; ++i) {
    const double t0 = now_seconds();
    step();
    const double dt = now_seconds() - t0;
    if (i >= r.warmup) total += dt;
    fmt::print(stderr, "  step {}/{}: {:.0f} ms{}\n", i + 1, r.warmup + r.steps, dt * 1e3, i < r.warmup ? " (warmup)" : "");
  }
  return total / static_cast<double>(r.steps);
}

}  // namespace spanformer::train
