#include "spanformer/train/family.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "families/families.h"
#include "spanformer/attention/record.h"
#include "spanformer/data/subwords.h"
#include "spanformer/dist/group.h"
#include "spanformer/dist/reducer.h"
#include "spanformer/io/safetensors.h"
#include "spanformer/models/sampling.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/precision.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/version.h"
#include "spanformer/viz/heatmap.h"

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
  if (arch == "gpt") return make_gpt_family(config, origin, overrides);
  if (arch == "vit") return make_vit_family(config, origin, overrides);
  if (arch == "seq2seq") return make_seq2seq_family(config, origin, overrides);
  fail("{}: unknown arch '{}' (adaptive-span, xl, gpt, vit or seq2seq)", origin, arch);
}

std::string arch_of(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) fail("{}: a config must be a JSON object", origin);
  if (!j.contains("arch")) return "adaptive-span";
  if (!j["arch"].is_string()) fail("{}: arch must be a string (adaptive-span, xl, gpt, vit or seq2seq)", origin);
  return j["arch"].get<std::string>();
}

}  // namespace

std::unique_ptr<Family> family_from_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  auto j = read_config_file(path);
  return make_family(arch_of(j, path), j, path, overrides);
}

std::unique_ptr<Family> family_from_json(const nlohmann::json& config, const std::string& origin,
                                         const std::vector<std::string>& overrides) {
  return make_family(arch_of(config, origin), config, origin, overrides);
}

std::unique_ptr<Family> family_from_checkpoint(const Checkpoint& checkpoint, const std::vector<std::string>& overrides) {
  auto family = make_family(checkpoint.family(), checkpoint.config(), checkpoint.path(), overrides);
  if (!overrides.empty()) {
    // A command that reads a checkpoint trains nothing: an override of a training key would be
    // silently ignored, so it is refused (the evaluation batch, threads and device are used).
    const auto before = make_family(checkpoint.family(), checkpoint.config(), checkpoint.path(), {})->config_json();
    const auto after = family->config_json();
    for (auto it = after["train"].begin(); it != after["train"].end(); ++it) {
      const std::string& key = it.key();
      if (key == "eval_batch_size" || key == "threads" || key == "device") continue;
      if (!before["train"].contains(key) || before["train"][key] != it.value())
        fail("the override of train.{} is not used when a checkpoint is read (it only affects training)", key);
    }
  }
  family->validate();
  family->set_vocabulary(checkpoint.vocab());
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
    std::vector<std::string> unknown;
    while (in >> word) {
      auto it = index.find(word);
      if (it != index.end()) {
        ids.push_back(it->second);
      } else {
        unknown.push_back(word);
        if (unk >= 0) ids.push_back(unk);
      }
    }
    if (!unknown.empty())
      fmt::print(stderr, "spanformer: warning: {} prompt word(s) not in the vocabulary, {}: {}\n", unknown.size(),
                 unk >= 0 ? "read as <unk>" : "left out", fmt::join(unknown.begin(), unknown.begin() + std::min<size_t>(unknown.size(), 10), " "));
    if (ids.empty()) ids.push_back(eos >= 0 ? eos : 0);
    return ids;
  }
  const auto byte_to_id = vocab.byte_to_id();
  std::string unknown;
  for (unsigned char c : prompt) {
    if (byte_to_id[c] >= 0) ids.push_back(byte_to_id[c]);
    else if (unknown.find(static_cast<char>(c)) == std::string::npos) unknown += static_cast<char>(c);
  }
  if (!unknown.empty()) {
    std::string shown;
    for (unsigned char c : unknown) shown += c >= 32 && c < 127 ? fmt::format("'{}' ", static_cast<char>(c)) : fmt::format("0x{:02x} ", c);
    shown.pop_back();
    fmt::print(stderr, "spanformer: warning: prompt characters not in the vocabulary were left out: {}\n", shown);
  }
  if (ids.empty()) ids.push_back(byte_to_id['\n'] >= 0 ? byte_to_id['\n'] : 0);  // start from <eos>
  return ids;
}

torch::Tensor accumulate_gradients(int64_t streams, int64_t split, std::vector<torch::Tensor>& state,
                                   const StepContext& ctx, const std::vector<torch::Tensor>& params,
                                   const GroupLoss& group_loss) {
  const int64_t part = streams / split;
  torch::Tensor loss_sum;
  std::vector<std::vector<torch::Tensor>> next(state.size());
  for (int64_t s = 0; s < split; ++s) {
    std::vector<torch::Tensor> part_state;
    for (auto& t : state) part_state.push_back(t.narrow(0, s * part, part));  // (B/split, T, H)
    torch::Tensor nll, loss;
    {  // train.amp: the forward under autocast, the backward (and everything after) outside it
      std::optional<compat::AutocastGuard> autocast;
      if (ctx.amp == Amp::kBf16) autocast.emplace(ctx.device_type, at::kBFloat16);
      std::tie(nll, loss) = group_loss(s * part, part, part_state);
    }
    for (size_t l = 0; l < state.size(); ++l)  // carried state keeps its dtype (autocast may narrow it)
      if (part_state[l].scalar_type() != state[l].scalar_type()) part_state[l] = part_state[l].to(state[l].scalar_type());
    if (s == split - 1) ctx.before_last_backward();
    (widen_reduced(loss) / static_cast<double>(split)).backward();
    auto mean = nll.detach().to(torch::kFloat) / static_cast<double>(split);
    loss_sum = loss_sum.defined() ? loss_sum + mean : mean;
    for (size_t l = 0; l < state.size(); ++l) next[l].push_back(part_state[l]);
  }
  for (size_t l = 0; l < state.size(); ++l) state[l] = split == 1 ? next[l][0] : torch::cat(next[l], 0);
  ctx.reduce_gradients(params);
  return loss_sum;
}

void save_stream_state(CheckpointWriter& out, const std::string& name, const std::vector<torch::Tensor>& state,
                       const std::function<torch::Tensor(const torch::Tensor&)>& gather) {
  for (size_t i = 0; i < state.size(); ++i) out.put(fmt::format("state.{}.{}", name, i), gather(state[i]));
}

std::vector<torch::Tensor> load_stream_state(const Checkpoint& in, const std::string& name, int64_t n, int64_t width,
                                             int64_t max_length, int64_t batch, int64_t first, int64_t count,
                                             torch::Device device) {
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    auto t = in.tensor(fmt::format("state.{}.{}", name, i));
    if (t.dim() != 3 || t.size(2) != width || t.size(1) > max_length)
      fail("checkpoint {}: state '{}.{}' has shape {}", in.path(), name, i, fmt::join(t.sizes(), "x"));
    if (t.size(0) != batch) fail("checkpoint {} was trained with batch_size {}, the config says {}", in.path(), t.size(0), batch);
    if (!torch::isfinite(t).all().item<bool>()) fail("checkpoint {}: state '{}.{}' holds non-finite values", in.path(), name, i);
    out.push_back(t.narrow(0, first, count).contiguous().to(device));
  }
  return out;
}

void sample_tokens(const data::Vocab& vocab, const SampleRequest& r, int64_t block,
                   const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                   const std::function<torch::Tensor(const torch::Tensor&)>& scores, torch::Device device) {
  models::SamplingOptions options{r.temperature, r.top_k, r.top_p};
  models::check(options);
  if (r.tokens < 0) fail("the number of tokens must be >= 0 (got {})", r.tokens);
  torch::NoGradGuard no_grad;
  auto ids = prompt_ids(vocab, r.prompt);
  torch::Tensor last;
  for (size_t start = 0; start < ids.size(); start += block) {
    const int64_t n = std::min<int64_t>(block, static_cast<int64_t>(ids.size() - start));
    last = forward(torch::from_blob(ids.data() + start, {1, n}, torch::kLong).to(device)).narrow(1, n - 1, 1);  // (1, 1, H)
  }
  for (int64_t t = 0; t < r.tokens; ++t) {
    const int64_t id = models::sample_token(scores(last).view({-1}), options);  // (V)
    if (r.on_text) r.on_text(vocab.decode(id));
    if (t + 1 < r.tokens) last = forward(torch::full({1, 1}, id, torch::kLong).to(device));
  }
}

namespace {

// A token as a tick label: bytes made visible (space, newline, tab, non-ASCII as hex), words as they are.
std::string token_label(const data::Vocab& vocab, int64_t id) {
  if (vocab.word_level) return vocab.tokens[static_cast<size_t>(id)];
  const std::string b = vocab.decode(id);
  if (b == "\n") return "\\n";
  if (b == "\t") return "\\t";
  if (b == " ") return "\u2423";  // open box
  if (b.size() == 1 && (static_cast<unsigned char>(b[0]) < 32 || static_cast<unsigned char>(b[0]) >= 127))
    return fmt::format("0x{:02x}", static_cast<unsigned char>(b[0]));
  return b;
}

}  // namespace

void draw_text_attention(const data::Vocab& vocab, const AttentionRequest& r, int64_t block,
                         const std::function<torch::Tensor(const torch::Tensor&)>& forward, torch::Device device) {
  if (r.texts.size() != 1 || !r.indices.empty()) fail("attention: a language model takes one --text");
  torch::NoGradGuard no_grad;
  auto ids = prompt_ids(vocab, r.texts[0]);
  const auto n_ids = static_cast<int64_t>(ids.size());
  // A short block first (the remainder), so that the recorded last block is a whole one.
  const int64_t last = std::max<int64_t>(0, n_ids - block);  // the last block starts here
  for (int64_t start = 0; start < last;) {
    const int64_t n = start == 0 && last % block != 0 ? last % block : block;
    forward(torch::from_blob(ids.data() + start, {1, n}, torch::kLong).to(device));
    start += n;
  }
  attention::WeightRecorder recorder;
  forward(torch::from_blob(ids.data() + last, {1, n_ids - last}, torch::kLong).to(device));
  const auto& layers = recorder.layers;  // (1, K, n, S + 1) each
  if (layers.empty()) fail("attention: this model recorded no attention weights");
  if (r.weights) *r.weights = layers;
  if (r.out.empty()) return;
  const auto L = static_cast<int64_t>(layers.size()), K = layers[0].size(1), n = layers[0].size(2);
  if (r.layer < -1 || r.layer >= L) fail("attention: --layer must be in [0, {}) (got {})", L, r.layer);
  if (r.head < -1 || r.head >= K) fail("attention: --head must be in [0, {}) (got {})", K, r.head);
  const int64_t R = std::min<int64_t>(n, 32);
  struct Panel {
    torch::Tensor w;  // (R, S + 1)
    std::string title;
  };
  std::vector<Panel> panels;
  auto rows = [&](int64_t l) { return layers[static_cast<size_t>(l)][0].narrow(1, n - R, R); };  // (K, R, S + 1)
  if (r.layer < 0) {
    for (int64_t l = 0; l < L; ++l)
      panels.push_back({r.head < 0 ? rows(l).mean(0) : rows(l)[r.head],
                        r.head < 0 ? fmt::format("layer {} (heads' mean)", l) : fmt::format("layer {} head {}", l, r.head)});
  } else if (r.head < 0) {
    for (int64_t h = 0; h < K; ++h) panels.push_back({rows(r.layer)[h], fmt::format("layer {} head {}", r.layer, h)});
  } else {
    panels.push_back({rows(r.layer)[r.head], fmt::format("layer {} head {}", r.layer, r.head)});
  }
  // The distances shown: up to the farthest any panel weighs (1e-6 of a row or more).
  int64_t farthest = 1;
  for (const auto& p : panels) {
    auto reach = p.w.ge(1e-6).any(0).nonzero();  // (k, 1) distances with weight
    if (reach.numel() > 0) farthest = std::max(farthest, reach.max().item<int64_t>());
  }
  const int64_t columns = farthest + 1, bins = std::min<int64_t>(columns, 360);
  std::vector<viz::Heatmap> out;
  for (const auto& p : panels) {
    viz::Heatmap h;
    auto w = p.w.narrow(1, 0, columns).contiguous();  // (R, columns) float64
    for (int64_t i = 0; i < R; ++i) {
      std::vector<double> row(static_cast<size_t>(bins), 0.0);
      auto row_i = w[i];  // (columns)
      auto a = row_i.accessor<double, 1>();
      for (int64_t d = 0; d < columns; ++d) row[static_cast<size_t>(d * bins / columns)] += a[d];
      h.values.push_back(std::move(row));
      h.row_ticks.push_back(token_label(vocab, ids[static_cast<size_t>(n_ids - R + i)]));
    }
    for (int64_t b = 0; b < bins; ++b) h.col_ticks.push_back(fmt::format("{}", (b * columns + bins - 1) / bins));
    h.title = p.title;
    h.row_label = "query (the text's last tokens)";
    h.col_label = bins < columns ? fmt::format("distance (bins of ~{})", columns / bins) : "distance (0 = the token itself)";
    out.push_back(std::move(h));
  }
  viz::write_heatmaps(r.out, out);
  fmt::print("{} tokens; the last {} drawn over distances 0 .. {} in {}\n", n_ids, R, farthest, r.out);
}

OptimizerOptions optimizer_options(const TrainConfig& train) {
  OptimizerOptions o;
  o.kind = train.optim;
  o.momentum = train.momentum;
  o.grad_clip = train.grad_clip;
  o.weight_decay = train.weight_decay;
  o.beta2 = train.adam_beta2;
  return o;
}

std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const TrainConfig& train) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : model.named_parameters()) params.emplace_back(item.key(), item.value());
  return std::make_unique<Optimizer>(params, optimizer_options(train));
}

void log_spans(const std::vector<std::vector<double>>& spans, nlohmann::json& record, std::string& text) {
  if (spans.empty()) return;
  std::vector<double> mean, max;
  for (const auto& z : spans) {
    double s = 0, m = 0;
    for (double v : z) s += v, m = std::max(m, v);
    mean.push_back(s / static_cast<double>(z.size()));
    max.push_back(m);
  }
  record["span_mean"] = mean;
  record["span_max"] = max;
  record["spans"] = spans;  // per layer, per head (tokens): the span-versus-training figure's data
  text += fmt::format(" | spans {:.0f}", fmt::join(mean, " "));
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

void report_bench(const BenchRequest& r, const char* family, const std::string& prefix, const std::string& what,
                  const std::string& figures_text, nlohmann::json figures) {
  if (r.json) {
    figures["family"] = family;
    figures["what"] = what;
    figures["threads"] = r.threads;
    figures["device"] = r.device.str();
    figures["peak_rss_mb"] = static_cast<double>(peak_rss_bytes()) / 1e6;
    fmt::print("{}\n", figures.dump());
    return;
  }
  fmt::print("{}: {}\n{}: {}, {}\n", prefix, what, prefix, figures_text, peak_memory_text(r.device.is_cuda()));
}

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
    config = nlohmann::json::parse(file.metadata["spanformer.config"]);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: its spanformer.config metadata is not JSON ({})", path, one_line_message(e));
  }
  if (arch_of(config, path) != file.metadata["spanformer.family"])
    fail("{}: its metadata names family '{}' but a config of arch '{}'", path, file.metadata["spanformer.family"],
         arch_of(config, path));
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
