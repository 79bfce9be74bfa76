// The GPT family on the one engine: a decoder-only model with a drop-in causal attention
// (models/gpt.h, attention/causal_attention.h).
//
// Train step: B / processes contexts of T tokens drawn at uniformly random starts (the Runner's
// DataRestart::kRandomContexts), batch_split groups each run forward, mean NLL + span loss, backward;
// gradients averaged over processes; AdamW with the shared schedule and global clipping; spans clamped.
// Validation: eval_blocks batches of B contexts at evenly spaced starts of the valid split (the same
// ones at every interval), mean NLL over all their tokens.
// Evaluation (`spanformer eval`): the whole split with a sliding window of T tokens and stride S
// (model.eval_stride): the first window scores all its tokens, each later window moves by S and scores
// only its last S (or fewer, at the end), so every token is scored once with at least T - S tokens of
// context (except the first T). Reported per token (bpc or perplexity), the same for every attention.
#include "train/families/families.h"
#include "train/families/gpt/decode_bench.h"
#include "spanformer/data/batches.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <map>

#include <fmt/ranges.h>

#include "spanformer/util/precision.h"
#include "spanformer/config/gpt_config.h"
#include "spanformer/data/corpus.h"
#include "spanformer/dist/group.h"
#include "spanformer/models/gpt.h"
#include "spanformer/train/optim.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/jsonl.h"

namespace spanformer::train {
namespace {

using models::GptModel;

// Sliding windows over n tokens (n - 1 targets): start of each window and how many of its last
// positions it scores. Every window has min(T, n - 1) positions.
struct Window {
  int64_t start, scored;
};
std::vector<Window> sliding_windows(int64_t n, int64_t T, int64_t stride) {
  std::vector<Window> out;
  const int64_t targets = n - 1, length = std::min(T, targets);
  if (length < 1) return out;
  out.push_back({0, length});
  for (int64_t end = length; end < targets;) {
    const int64_t next = std::min(end + stride, targets);
    out.push_back({next - length, next - end});
    end = next;
  }
  return out;
}

class GptFamily : public ConfiguredFamily<GptConfig>,
                  public TokenStreams,
                  public Sampling,
                  public Spans,
                  public AttentionPictures {
 public:
  using ConfiguredFamily::ConfiguredFamily;

  const char* name() const override { return "gpt"; }
  const GptConfig& config() const { return config_; }
  void set_vocab_size(int64_t V, const std::string& origin) override { fill_vocab_size(config_.model.vocab_size, V, origin); }
  std::string model_difference(const nlohmann::json& checkpoint_config) const override {
    return spanformer::model_difference(config_, gpt_config_from_json(checkpoint_config, "checkpoint"));
  }

  void build() override {
    spanformer::validate(config_.model);
    if (config_.model.vocab_size < 1) fail("gpt: vocab_size is unknown (set model.vocab_size or give data)");
    model_ = GptModel(config_.model);
  }
  torch::nn::Module& module() override { return *model_; }

  void load_weights(const Checkpoint& in) override {
    Family::load_weights(in);
    model_->clamp_spans();  // the host copies of the spans, which the attention's band reads
  }

  int64_t block_length() const override { return config_.model.context; }
  DataRestart data_restart() const override { return DataRestart::kRandomContexts; }

  torch::Tensor train_step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) override {
    model_->train();
    auto loss = forward_backward(x, y, ctx);
    optimizer_->step(ctx.lr);
    model_->clamp_spans();
    return loss;
  }

  // Gradients of the step's loss (zeroed first), the loss returned as a 0-dim device tensor.
  torch::Tensor forward_backward(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) {
    optimizer_->zero_grad();
    std::vector<torch::Tensor> no_state;
    return accumulate_gradients(x.size(0), config_.train.batch_split, no_state, ctx, model_->parameters(),
                                [&](int64_t first, int64_t count, std::vector<torch::Tensor>&) {
                                  auto logits = widen_reduced(model_->logits(model_->forward(x.narrow(0, first, count))));  // (b, T, V)
                                  auto nll = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                                       y.narrow(0, first, count).reshape({-1}));
                                  return std::pair{nll, nll + model_->span_loss()};
                                });
  }

  double validation_loss(const data::TokenFile& valid, int64_t batch, int64_t first, int64_t count, int64_t&) override {
    const int64_t T = config_.model.context, windows = config_.train.eval_blocks * batch;
    if (valid.size() <= T + 1) fail("{} is too short for contexts of {} tokens", valid.path(), T);
    torch::NoGradGuard no_grad;
    model_->eval();
    double sum = 0;
    for (int64_t i = 0; i < config_.train.eval_blocks; ++i) {
      std::vector<int64_t> starts;
      for (int64_t b = first; b < first + count; ++b) {
        const int64_t w = i * batch + b;
        starts.push_back(windows > 1 ? w * (valid.size() - T - 1) / (windows - 1) : 0);
      }
      auto [vx, vy] = data::make_contexts(valid, starts, T, device());
      auto logits = model_->logits(model_->forward(vx));  // (b, T, V)
      sum += torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), vy.reshape({-1})).item<double>();
    }
    model_->train();
    return sum / static_cast<double>(config_.train.eval_blocks);
  }

  void log_extras(int64_t, nlohmann::json& record, std::string& text) override { log_spans(model_->spans(), record, text); }

  EvalReport evaluate(const data::TokenFile& tokens, const EvalRequest& r) override {
    const int64_t batch = r.batch > 0 ? r.batch : config_.train.eval_batch_size;
    const int64_t T = config_.model.context, S = config_.model.stride();
    if (tokens.size() < 2) fail("{} has {} tokens: nothing to score", tokens.path(), tokens.size());
    const int64_t world = r.group ? r.group->world() : 1, rank = r.group ? r.group->rank() : 0;
    if (!r.dump_logprobs.empty() && world > 1) fail("--dump-logprobs runs in one process");
    auto windows = sliding_windows(tokens.size(), T, S);
    const int64_t length = std::min(T, tokens.size() - 1);
    torch::NoGradGuard no_grad;
    model_->eval();
    double nll = 0;
    int64_t scored = 0, done = 0;
    std::vector<torch::Tensor> logprobs;  // (scored) per window, in text order (dump only)
    std::vector<Window> mine;             // this process's windows: every world-th
    for (size_t w = static_cast<size_t>(rank); w < windows.size(); w += static_cast<size_t>(world)) mine.push_back(windows[w]);
    for (size_t i = 0; i < mine.size(); i += static_cast<size_t>(batch)) {
      const size_t n = std::min(mine.size() - i, static_cast<size_t>(batch));
      std::vector<int64_t> starts;
      for (size_t j = 0; j < n; ++j) starts.push_back(mine[i + j].start);
      auto [x, y] = data::make_contexts(tokens, starts, length, device());
      auto lp = torch::log_softmax(model_->logits(model_->forward(x)).to(torch::kDouble), -1)
                    .gather(-1, y.unsqueeze(-1))
                    .squeeze(-1)
                    .cpu();  // (n, length)
      for (size_t j = 0; j < n; ++j) {
        const int64_t c = mine[i + j].scored;
        auto part = lp[static_cast<int64_t>(j)].narrow(0, length - c, c);  // (c)
        nll -= part.sum().item<double>();
        scored += c;
        if (!r.dump_logprobs.empty()) logprobs.push_back(part);
      }
      done += static_cast<int64_t>(n);
      if (r.progress) r.progress(done, static_cast<int64_t>(mine.size()));
    }
    if (r.group) {
      nll = r.group->all_reduce_sum(nll);
      scored = static_cast<int64_t>(r.group->all_reduce_sum(static_cast<double>(scored)));
    }
    if (!r.dump_logprobs.empty()) write_logprobs(r.dump_logprobs, torch::cat(logprobs).unsqueeze(0));
    EvalReport report;
    report.nll = nll / static_cast<double>(scored);
    report.tokens = scored;
    report.blocks = static_cast<int64_t>(windows.size());
    report.details = fmt::format("{} windows of {} tokens, stride {}, {} tokens", windows.size(), length, S, scored);
    return report;
  }

  void sample(const data::Vocab& vocab, const SampleRequest& r) override {
    model_->eval();
    model_->lay_out_for_decoding();
    // bfloat16: the weights cast once for these tokens, the float32 ones put back after (a loaded model
    // in Python evaluates and samples again), also when sampling fails.
    std::vector<std::pair<torch::Tensor, torch::Tensor>> kept;  // (tensor, its float32 values)
    struct Restore {
      std::vector<std::pair<torch::Tensor, torch::Tensor>>& kept;
      ~Restore() {
        torch::NoGradGuard no_grad;
        for (auto& [t, values] : kept) t.set_data(values);
      }
    } restore{kept};
    if (r.bfloat16) {
      for (auto& p : model_->parameters()) kept.emplace_back(p, p.detach().clone());
      for (auto& b : model_->buffers())
        if (b.is_floating_point()) kept.emplace_back(b, b.detach().clone());
      model_->to(torch::kBFloat16);
      model_->lay_out_for_decoding();  // the bfloat16 weights' own layout
    }
    models::GptDecoder decoder;
    sample_tokens(vocab, r, std::max<int64_t>(1, config_.model.context / 2),
                  [&](const torch::Tensor& x) { return model_->extend(x, decoder); },
                  [&](const torch::Tensor& last) { return model_->logits(last); }, device());
  }

  void draw_attention(const AttentionRequest& r) override {
    if (r.vocab == nullptr) fail("attention: no vocabulary given");
    model_->eval();
    models::GptDecoder decoder;
    draw_text_attention(*r.vocab, r, std::max<int64_t>(1, config_.model.context / 2),
                        [&](const torch::Tensor& x) { return model_->extend(x, decoder); }, device());
  }

  std::vector<std::vector<double>> spans() const override { return model_->spans(); }
  int64_t span_limit() const override {
    return config_.model.attention == attention::CausalKind::kAdaptiveSpan ? config_.model.span_limit() : 0;
  }
  int64_t span_ramp() const override { return config_.model.adapt_span_ramp; }

  void bench(const BenchRequest& r) override;

 private:
  torch::Device device() const { return model_->wte->weight.device(); }

  GptModel model_{nullptr};
};

void GptFamily::bench(const BenchRequest& r) {
  const double span = bench_span(r);
  const std::string span_dist = bench_span_dist(r);
  check_decoding_settings(r);  // decode_bench.cpp
  auto& c = config_.model;
  if (c.vocab_size == 0) c.vocab_size = 256;
  if ((span >= 0 || !span_dist.empty()) && c.attention != attention::CausalKind::kAdaptiveSpan)
    fail("bench: --span and --span-dist need model.attention = adaptive_span");
  if (span >= 0) c.adapt_span_init = std::min(1.0, span / static_cast<double>(c.span_limit()));
  validate();
  torch::manual_seed(config_.train.seed);
  build();
  if (span_dist == "bimodal") {
    std::vector<torch::Tensor> ratios;
    for (const auto& block : *model_->blocks) ratios.push_back(block->as<models::GptBlock>()->attn->span->span_ratio);
    set_bimodal_spans(ratios, static_cast<double>(c.span_limit()));
  }
  model_->clamp_spans();
  model_->to(r.device);
  make_optimizers();
  const int64_t B = config_.train.batch_size, T = c.context, V = c.vocab_size;
  if (r.mode == BenchMode::kGenerate) return bench_decoding(model_, c, r, name());  // decode_bench.cpp
  const StepContext ctx = bench_context(config_.train, r.device);
  const auto spans = model_->spans();  // per layer, per head (tokens), as the steps start
  const auto timed = time_token_steps(
      r, V, B, T, r.device,
      [&](const torch::Tensor& x, const torch::Tensor& y) {
        model_->eval();
        auto logits = model_->logits(model_->forward(x));  // (B, T, V)
        torch::cross_entropy_loss(logits.reshape({-1, V}), y.reshape({-1})).item<double>();
      },
      [&](const torch::Tensor& x, const torch::Tensor& y) { return train_step(x, y, ctx).item<double>(); });
  const double per_step = timed.per_step, tokens_per_step = static_cast<double>(B * T);
  double band = 0;
  for (const auto& block : *model_->blocks)
    band += static_cast<double>(block->as<models::GptBlock>()->attn->band(T)) / static_cast<double>(c.n_layer);
  report_bench(r, name(), "bench",
               fmt::format("{}, {} layers{}, H {}, K {}, T {}, B {}, threads {}, attention {} ({}), keys per query <= {:.0f}",
                           r.eval() ? "eval forward" : "train step", c.n_layer, c.reversible ? " (reversible)" : "", c.d_model, c.n_head, T, B, r.threads,
                           attention::causal_kind_name(c.attention), attention::attn_impl_name(c.attn_impl), band),
               fmt::format("{:.1f} ms/step, {:.0f} tokens/s", per_step * 1e3, tokens_per_step / per_step),
               {{"mode", bench_mode_name(r.mode)}, {"ms_per_step", per_step * 1e3},
                {"tokens_per_s", tokens_per_step / per_step}, {"attention", attention::causal_kind_name(c.attention)},
                {"keys_per_query", band}, {"params", parameter_count(*model_)}, {"spans", spans},
                {"first_loss", timed.first_loss}});
}

}  // namespace

std::vector<BenchSetting> gpt_bench_settings() {
  auto settings = span_bench_settings();
  settings.push_back({"tokens", "generate mode: generate this many tokens, the last at a full context (default: the second half of the context)"});
  settings.push_back({"dtype", "generate mode: float32, or bfloat16 (the weights cast once, every step in bfloat16)"});
  settings.push_back({"recompute", "generate mode: 1 also times recomputing the whole context for each token, 0 not"});
  settings.push_back({"batch", "generate mode: rows decoded together, each its own prompt (default 1)"});
  return settings;
}

std::unique_ptr<Family> make_gpt_family(const nlohmann::json& config, const std::string& origin,
                                        const std::vector<std::string>& overrides) {
  return configured_family<GptFamily>(gpt_config_from_json(config, origin), overrides);
}

}  // namespace spanformer::train
