// The adaptive-span family (Sukhbaatar et al., 2019) on the one engine: the reference's
// (facebookresearch/adaptive-span) train step, validation and evaluation protocol.
//
// Train step: B / processes local streams; batch_split groups of them each run forward, NLL + span
// loss, backward (gradients accumulate); caches (B, C_l, H) carry over to the next block. Then the
// gradients are averaged over processes, the optimizer steps, spans are clamped to [0, 1].
// Validation: eval_blocks blocks of the valid streams, continuing the stream and its caches from one
// interval to the next (the reference's rule). Evaluation: evaluate.h beside this file.
#include "spanformer/data/batches.h"
#include "spanformer/util/precision.h"
#include "train/families/adaptive_span/train_step.h"

#include "train/families/families.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>

#include <fmt/ranges.h>

#include "spanformer/config/adaptive_span_config.h"
#include "spanformer/io/reference_import.h"
#include "spanformer/models/transformer_seq.h"
#include "train/families/adaptive_span/evaluate.h"
#include "spanformer/train/optim.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"

namespace spanformer::train {

torch::Tensor train_step(models::TransformerSeq& model, Optimizer& optimizer, const torch::Tensor& x,
                         const torch::Tensor& y, std::vector<torch::Tensor>& caches, int64_t batch_split,
                         const StepContext& ctx) {
  model->train();
  optimizer.zero_grad();
  auto loss = accumulate_gradients(x.size(0), batch_split, caches, ctx, model->parameters(),
                                   [&](int64_t first, int64_t count, std::vector<torch::Tensor>& part) {
                                     auto logits = widen_reduced(model->logits(model->forward(x.narrow(0, first, count), part)));  // (b, M, V)
                                     auto nll = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                                          y.narrow(0, first, count).reshape({-1}));
                                     return std::pair{nll, nll + model->span_loss()};
                                   });
  optimizer.step(ctx.lr);
  model->clamp_spans();
  return loss;
}

namespace {

class AdaptiveSpanFamily : public ConfiguredFamily<AdaptiveSpanConfig>,
                  public TokenStreams,
                  public Sampling,
                  public Spans,
                  public AttentionPictures,
                  public ReferenceWeights {
 public:
  using ConfiguredFamily::ConfiguredFamily;

  const char* name() const override { return "adaptive-span"; }
  void set_vocab_size(int64_t V, const std::string& origin) override { fill_vocab_size(config_.model.vocab_size, V, origin); }
  std::string model_difference(const nlohmann::json& checkpoint_config) const override {
    return spanformer::model_difference(config_, config_from_json(checkpoint_config, "checkpoint"));
  }

  void build() override {
    spanformer::validate(config_.model);
    model_ = models::TransformerSeq(config_.model);
  }
  torch::nn::Module& module() override { return *model_; }
  models::TransformerSeq& model() { return model_; }
  const AdaptiveSpanConfig& config() const { return config_; }

  void load_weights(const Checkpoint& in) override {
    Family::load_weights(in);
    model_->sync_spans();
  }

  int64_t block_length() const override { return config_.model.block_size; }
  DataRestart data_restart() const override { return DataRestart::kRandomOffset; }

  void init_state(int64_t streams) override {
    train_caches_ = model_->initial_caches(streams);
    valid_caches_ = model_->initial_caches(streams);
    to_device(train_caches_);
    to_device(valid_caches_);
  }
  void reset_train_state() override { zero(train_caches_); }

  torch::Tensor train_step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) override {
    return step(x, y, ctx);
  }

  double validation_loss(const data::TokenFile& valid, int64_t batch, int64_t first, int64_t count,
                         int64_t& valid_pos) override {
    const int64_t M = config_.model.block_size;
    data::Streams streams(valid, batch);
    if (streams.length() <= 2 * M) fail("{} is too short for {} streams of blocks of {}", valid.path(), batch, M);
    torch::NoGradGuard no_grad;
    model_->eval();
    auto sum = torch::zeros({}, torch::kDouble);
    for (int64_t i = 0; i < config_.train.eval_blocks; ++i) {
      auto [vx, vy] = data::make_block(streams, valid_pos, M, device(), first, count);
      sum = sum + eval_block(model_, vx, vy, valid_caches_).to(torch::kCPU, torch::kDouble);
      valid_pos += M;
      if (valid_pos >= streams.length() - M) {
        valid_pos = 0;
        zero(valid_caches_);
      }
    }
    model_->train();
    return sum.item<double>() / static_cast<double>(config_.train.eval_blocks);
  }

  void save_state(CheckpointWriter& out, const std::function<torch::Tensor(const torch::Tensor&)>& gather) override {
    out.put_int("state.nb_caches", static_cast<int64_t>(train_caches_.size()));
    save_stream_state(out, "train_cache", train_caches_, gather);
    save_stream_state(out, "valid_cache", valid_caches_, gather);
  }
  void load_state(const Checkpoint& in, int64_t batch, int64_t first, int64_t count) override {
    const auto& c = config_.model;
    if (in.integer("state.nb_caches") != c.nb_layers) fail("checkpoint {} holds caches for another number of layers", in.path());
    for (auto [key, target] : {std::pair{"train_cache", &train_caches_}, std::pair{"valid_cache", &valid_caches_}})
      *target = load_stream_state(in, key, c.nb_layers, c.hidden_size, c.attn_span + c.block_size, batch, first, count, device());
  }

  void log_extras(int64_t, nlohmann::json& record, std::string& text) override { log_spans(model_->spans(), record, text); }

  EvalReport evaluate(const data::TokenFile& tokens, const EvalRequest& r) override {
    const int64_t batch = r.batch > 0 ? r.batch : config_.train.eval_batch_size;
    auto result = train::evaluate(model_, tokens, batch, r.progress, r.group, r.dump_logprobs);
    EvalReport report;
    report.nll = result.nll;
    report.tokens = result.tokens;
    report.blocks = result.blocks;
    report.details = fmt::format("{} blocks, {} tokens", result.blocks, result.tokens);
    return report;
  }

  void sample(const data::Vocab& vocab, const SampleRequest& r) override {
    model_->eval();
    auto caches = model_->initial_caches(1);
    to_device(caches);
    sample_tokens(vocab, r, config_.model.block_size, [&](const torch::Tensor& x) { return model_->forward(x, caches); },
                  [&](const torch::Tensor& last) { return model_->logits(last); }, device());
  }

  void draw_attention(const AttentionRequest& r) override {
    if (r.vocab == nullptr) fail("attention: no vocabulary given");
    model_->eval();
    auto caches = model_->initial_caches(1);
    to_device(caches);
    draw_text_attention(*r.vocab, r, config_.model.block_size, [&](const torch::Tensor& x) { return model_->forward(x, caches); },
                        device());
  }

  std::vector<std::vector<double>> spans() const override { return model_->spans(); }
  int64_t span_limit() const override { return config_.model.attn_span; }
  int64_t span_ramp() const override { return config_.model.adapt_span_ramp; }

  void bench(const BenchRequest& r) override;

  void import_weights(const std::string& kind, const std::string& path) override {
    if (kind != "adaptive-span") unsupported("import from " + kind);
    io::load_reference_state_dict(model_, path);
  }
  void export_weights(const std::string& kind, const std::string& path) override {
    if (kind != "adaptive-span") unsupported("export to " + kind);
    io::save_reference_state_dict(model_, path);
  }

 private:
  torch::Device device() const { return model_->key_pe.device(); }
  void to_device(std::vector<torch::Tensor>& v) const {
    for (auto& t : v) t = t.to(device());
  }
  static void zero(std::vector<torch::Tensor>& v) {
    for (auto& t : v) t = torch::zeros_like(t);
  }

  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) {
    return train::train_step(model_, *optimizer_, x, y, train_caches_, config_.train.batch_split, ctx);
  }

  models::TransformerSeq model_{nullptr};
  std::vector<torch::Tensor> train_caches_, valid_caches_;
};

// The learned spans of a checkpoint's model (same layers and heads), for benchmarking at them.
void copy_spans(models::TransformerSeq& model, const std::string& path) {
  Checkpoint checkpoint(path);
  auto source_family = family_from_checkpoint(checkpoint);
  auto* source = dynamic_cast<AdaptiveSpanFamily*>(source_family.get());
  if (!source) fail("--spans-from {}: not an adaptive-span checkpoint", path);
  auto& s = source->model();
  if (s->layers.size() != model->layers.size() || s->config().nb_heads != model->config().nb_heads)
    fail("--spans-from {}: {} layers x {} heads, the benchmark model has {} x {}", path, s->layers.size(),
         s->config().nb_heads, model->layers.size(), model->config().nb_heads);
  if (!model->config().adapt_span || !s->config().adapt_span) fail("--spans-from needs adapt_span on both models");
  torch::NoGradGuard no_grad;
  const double scale = static_cast<double>(s->config().attn_span) / static_cast<double>(model->config().attn_span);
  for (size_t l = 0; l < model->layers.size(); ++l)
    model->layers[l]->attn->span->span_ratio.copy_((s->layers[l]->attn->span->span_ratio * scale).clamp(0.0, 1.0));
  model->sync_spans();
}

void AdaptiveSpanFamily::bench(const BenchRequest& r) {
  if (r.mode == BenchMode::kGenerate) unsupported("bench --mode generate");
  const double span = bench_span(r);
  const std::string span_dist = bench_span_dist(r), spans_from = r.text("spans-from");
  if (config_.model.vocab_size == 0) config_.model.vocab_size = 256;
  if (span >= 0) config_.model.adapt_span_init = std::min(1.0, span / static_cast<double>(config_.model.attn_span));
  validate();
  torch::manual_seed(config_.train.seed);
  build();
  if (span_dist == "bimodal") {
    if (!model_->config().adapt_span) fail("--span-dist needs adapt_span");
    std::vector<torch::Tensor> ratios;
    for (auto& layer : model_->layers) ratios.push_back(layer->attn->span->span_ratio);
    set_bimodal_spans(ratios, static_cast<double>(config_.model.attn_span));
    model_->sync_spans();
  }
  if (!spans_from.empty()) copy_spans(model_, checkpoint_file(spans_from));
  model_->to(r.device);
  make_optimizers();
  const int64_t B = config_.train.batch_size, M = config_.model.block_size, V = config_.model.vocab_size;
  init_state(B);
  const StepContext ctx = bench_context(config_.train, r.device);
  const auto spans = model_->spans();  // per layer, per head (tokens), as the steps start
  const auto timed = time_token_steps(
      r, V, B, M, device(),
      [&](const torch::Tensor& x, const torch::Tensor& y) {
        model_->eval();
        eval_block(model_, x, y, train_caches_).item<double>();
      },
      [&](const torch::Tensor& x, const torch::Tensor& y) { return step(x, y, ctx).item<double>(); });
  const double per_step = timed.per_step;
  double mean_span = 0;
  int64_t used = 0;
  std::string paths;
  for (auto& l : model_->layers) {
    used += l->attn->used_span();
    paths += l->attn->uses_fused_op(B, M) ? 'f' : 'p';
  }
  for (auto& z : model_->spans())
    for (double v : z) mean_span += v / static_cast<double>(z.size() * model_->layers.size());
  const auto& c = config_.model;
  const double keys = static_cast<double>(used) / static_cast<double>(model_->layers.size());
  const double tokens_per_s = static_cast<double>(B * M) / per_step;
  report_bench(r, name(), "bench",
               fmt::format("{} {}, {} layers, H {}, K {}, L {}, M {}, B {}, threads {}, attention {} (layers {}), "
                           "mean span {:.0f}, keys/layer {:.0f}",
                           r.eval() ? "eval" : "train", r.eval() ? "forward" : "step", c.nb_layers, c.hidden_size,
                           c.nb_heads, c.attn_span, M, B, r.threads, attention::attn_impl_name(c.attn_impl), paths,
                           mean_span, keys),
               fmt::format("{:.1f} ms/step, {:.0f} tokens/s", per_step * 1e3, tokens_per_s),
               {{"mode", bench_mode_name(r.mode)}, {"ms_per_step", per_step * 1e3}, {"tokens_per_s", tokens_per_s},
                {"attention", attention::attn_impl_name(c.attn_impl)}, {"layer_paths", paths},
                {"mean_span", mean_span}, {"keys_per_layer", keys}, {"params", parameter_count(*model_)}, {"spans", spans},
                {"first_loss", timed.first_loss}});
}

}  // namespace

std::vector<BenchSetting> adaptive_span_bench_settings() {
  auto settings = span_bench_settings();
  settings.push_back({"spans-from", "a trained adaptive-span checkpoint or run directory: its learned spans, "
                                    "layer by layer (the models' shapes must agree)"});
  return settings;
}

std::unique_ptr<Family> make_adaptive_span_family(const nlohmann::json& config, const std::string& origin,
                                                  const std::vector<std::string>& overrides) {
  return configured_family<AdaptiveSpanFamily>(config_from_json(config, origin), overrides);
}

}  // namespace spanformer::train
