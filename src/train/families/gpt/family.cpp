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
#include "train/step_graph.h"
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
                  public AttentionPictures,
                  public GraphedSteps,
                  public GraphedSampling {
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

  // train.cuda_graphs: dense or flash attention without its dropout (the attentions whose step reads
  // nothing on the host), Adam or AdamW (the update that reads its rate on the device).
  std::string graph_refusal() const override {
    const auto& m = config_.model;
    if (m.attention != attention::CausalKind::kDense && m.attention != attention::CausalKind::kFlash)
      return fmt::format("its {} attention is not captured (dense and flash are)", attention::causal_kind_name(m.attention));
    if (m.attention == attention::CausalKind::kFlash && m.attn_dropout > 0)
      return "flash attention draws its dropout seed on the host (set model.attn_dropout to 0)";
    if (m.reversible) return "the reversible layers recompute the forward in the backward, outside autograd's graph";
    if (config_.train.optim != OptimKind::kAdam && config_.train.optim != OptimKind::kAdamW)
      return fmt::format("train.optim is {}; the captured update is Adam's or AdamW's", optim_name(config_.train.optim));
    return "";
  }
  void begin_graph_step(const StepContext& ctx) override {
    model_->train();
    optimizer_->begin_graph_step(ctx.lr);
  }
  torch::Tensor graph_step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) override {
    auto loss = forward_backward(x, y, ctx);
    optimizer_->graph_step();
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

  // generate --cuda-graphs: the fixed-shape step (models/gpt.h) of every pattern with a KV cache.
  std::string sampling_graph_refusal() const override { return model_->fixed_shape_refusal(); }

  void sample(const data::Vocab& vocab, const SampleRequest& r) override {
    model_->eval();
    model_->lay_out_for_decoding();
    if (r.bfloat16) model_->to(torch::kBFloat16);
    models::GptDecoder decoder;
    std::unique_ptr<StepGraph> graph;  // each new token's step captured once, then replayed
    if (r.cuda_graphs) {
      if (const auto why = sampling_graph_refusal(); !why.empty()) fail("generate --cuda-graphs: {}", why);
      graph = std::make_unique<StepGraph>(device(), StepGraph::kWarmup, "generate --cuda-graphs");
      replay_steps(decoder, *graph);
    }
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

  // The decoder's per-token steps at fixed shapes, run through `graph` (captured once, then replayed).
  static void replay_steps(models::GptDecoder& d, StepGraph& graph) {
    d.fixed_shapes = true;
    d.runner = [&graph](const torch::Tensor& x, const torch::Tensor& at, const models::GptStepFn& step) {
      return graph.run(x, at, step);
    };
  }

  GptModel model_{nullptr};
};

void GptFamily::bench(const BenchRequest& r) {
  const double span = bench_span(r);
  const std::string span_dist = bench_span_dist(r);
  const int64_t tokens = r.integer("tokens", 0);  // generate mode: 0 = the second half of the context
  if (r.has("tokens") && r.mode != BenchMode::kGenerate) fail("bench: --tokens is for --mode generate");
  if (r.has("dtype") && r.mode != BenchMode::kGenerate) fail("bench: --dtype is for --mode generate (training: train.amp)");
  if (r.has("recompute") && r.mode != BenchMode::kGenerate) fail("bench: --recompute is for --mode generate");
  if (r.has("tokens") && tokens < 1) fail("bench: --tokens must be >= 1 (got {})", tokens);
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
  std::string what;
  double per_step = 0, tokens_per_step = static_cast<double>(B * T);
  if (r.mode == BenchMode::kGenerate) {  // one token at a time after a prompt (T / 2 or T - tokens), to a full context, cache against none
    if (tokens >= T) fail("bench --tokens {}: must be below the context {}", tokens, T);
    model_->eval();
    model_->lay_out_for_decoding();
    const std::string dtype = r.has("dtype") ? r.text("dtype") : "float32";
    if (dtype != "float32" && dtype != "bfloat16") fail("bench: --dtype must be float32 or bfloat16 (got '{}')", dtype);
    if (dtype == "bfloat16") model_->to(torch::kBFloat16);
    const int64_t recompute = r.integer("recompute", 1);
    if (recompute != 0 && recompute != 1) fail("bench: --recompute must be 0 or 1 (got {})", recompute);
    torch::NoGradGuard no_grad;
    const int64_t prompt = tokens > 0 ? T - tokens : std::max<int64_t>(1, T / 2), steps = T - prompt;
    // train.cuda_graphs: a third row, each token's step at fixed shapes replayed as a CUDA graph (one
    // decoder and graph for every round: the prompt refills the same buffers; captured in the first).
    std::unique_ptr<StepGraph> graph;
    models::GptDecoder graphed;
    if (config_.train.cuda_graphs) {
      if (const auto why = sampling_graph_refusal(); !why.empty()) fail("bench: generation as a CUDA graph: {}", why);
      graph = std::make_unique<StepGraph>(r.device, StepGraph::kWarmup, "train.cuda_graphs");
      replay_steps(graphed, *graph);
    }
    auto run = [&](models::GptDecoder& d) {
      d.history.clear();
      d.start = 0;
      model_->extend(torch::randint(V, {1, prompt}, torch::kLong).to(r.device), d);
      const double t0 = now_seconds();
      torch::Tensor last;
      for (int64_t i = 0; i < steps; ++i) last = model_->extend(torch::randint(V, {1, 1}, torch::kLong).to(r.device), d);
      last.sum().item<double>();  // the device's work done
      return static_cast<double>(steps) / (now_seconds() - t0);
    };
    double cached = 0, recomputed = 0, replayed = 0;
    for (int64_t i = 0; i < r.warmup + r.steps; ++i) {
      models::GptDecoder with_cache, without;
      without.use_cache = false;
      const double a = run(with_cache), b = recompute ? run(without) : 0.0, g = graph ? run(graphed) : 0.0;
      fmt::print(stderr, "  round {}/{}: {:.0f} tokens/s with the cache, {:.0f} without{}{}\n", i + 1, r.warmup + r.steps,
                 a, b, graph ? fmt::format(", {:.0f} as a CUDA graph", g) : "", i < r.warmup ? " (warmup)" : "");
      if (i >= r.warmup) {
        const double w = 1.0 / static_cast<double>(r.steps);
        cached += a * w, recomputed += b * w, replayed += g * w;
      }
    }
    nlohmann::json fields{{"mode", "generate"}, {"dtype", dtype}, {"cached_tokens_per_s", cached},
                          {"recomputed_tokens_per_s", recompute ? nlohmann::json(recomputed) : nlohmann::json()},
                          {"attention", attention::causal_kind_name(c.attention)}};
    std::string graphed_text;
    if (graph) {
      fields["graphed_tokens_per_s"] = replayed;
      graphed_text = fmt::format(", {:.1f} tokens/s as a CUDA graph ({:.2f}x the cache)", replayed, replayed / cached);
    }
    report_bench(r, name(), "bench",
                 fmt::format("generate, {} layers, H {}, K {}, T {}, attention {}, {}, tokens {} .. {} after a prompt of {}",
                             c.n_layer, c.d_model, c.n_head, T, attention::causal_kind_name(c.attention), dtype,
                             prompt + 1, T, prompt),
                 fmt::format("{:.1f} tokens/s with the KV cache{}{}", cached,
                             recompute ? fmt::format(", {:.1f} tokens/s recomputing the context ({:.2f}x)", recomputed,
                                                     cached / recomputed)
                                       : std::string(),
                             graphed_text),
                 fields);
    return;
  }
  const StepContext ctx = bench_context(config_.train, r.device);
  double first_loss = std::nan("");  // the mean NLL of the first step, before any update (nats)
  const auto spans = model_->spans();  // per layer, per head (tokens), as the steps start
  std::unique_ptr<StepGraph> graph;  // train.cuda_graphs: the timed steps replay the captured one
  if (!r.eval() && config_.train.cuda_graphs) {
    if (const auto why = graph_refusal(); !why.empty()) fail("train.cuda_graphs cannot capture this gpt step: {}", why);
    graph = std::make_unique<StepGraph>(r.device, std::max<int64_t>(1, r.warmup - 1));  // captured in the warm-up
  }
  per_step = time_steps(r, [&] {
    auto x = torch::randint(V, {B, T}, torch::kLong).to(r.device);
    auto y = torch::randint(V, {B, T}, torch::kLong).to(r.device);
    if (r.eval()) {
      torch::NoGradGuard no_grad;
      model_->eval();
      auto logits = model_->logits(model_->forward(x));
      torch::cross_entropy_loss(logits.reshape({-1, V}), y.reshape({-1})).item<double>();
    } else {
      if (graph) begin_graph_step(ctx);
      const auto step = [&](const torch::Tensor& gx, const torch::Tensor& gy) { return graph_step(gx, gy, ctx); };
      const double loss = (graph ? graph->run(x, y, step) : train_step(x, y, ctx)).item<double>();
      if (std::isnan(first_loss)) first_loss = loss;
    }
  });
  double band = 0;
  for (const auto& block : *model_->blocks)
    band += static_cast<double>(block->as<models::GptBlock>()->attn->band(T)) / static_cast<double>(c.n_layer);
  what = r.eval() ? "eval forward" : graph ? "train step (CUDA graph)" : "train step";
  report_bench(r, name(), "bench",
               fmt::format("{}, {} layers{}, H {}, K {}, T {}, B {}, threads {}, attention {} ({}), keys per query <= {:.0f}",
                           what, c.n_layer, c.reversible ? " (reversible)" : "", c.d_model, c.n_head, T, B, r.threads,
                           attention::causal_kind_name(c.attention), attention::attn_impl_name(c.attn_impl), band),
               fmt::format("{:.1f} ms/step, {:.0f} tokens/s", per_step * 1e3, tokens_per_step / per_step),
               {{"mode", bench_mode_name(r.mode)}, {"ms_per_step", per_step * 1e3},
                {"tokens_per_s", tokens_per_step / per_step}, {"attention", attention::causal_kind_name(c.attention)},
                {"keys_per_query", band}, {"params", parameter_count(*model_)}, {"spans", spans},
                {"first_loss", r.eval() ? nlohmann::json() : nlohmann::json(first_loss)}});
}

}  // namespace

std::vector<BenchSetting> gpt_bench_settings() {
  auto settings = span_bench_settings();
  settings.push_back({"tokens", "generate mode: generate this many tokens, the last at a full context (default: the second half of the context)"});
  settings.push_back({"dtype", "generate mode: float32, or bfloat16 (the weights cast once, every step in bfloat16)"});
  settings.push_back({"recompute", "generate mode: 1 also times recomputing the whole context for each token, 0 not"});
  return settings;
}

std::unique_ptr<Family> make_gpt_family(const nlohmann::json& config, const std::string& origin,
                                        const std::vector<std::string>& overrides) {
  return configured_family<GptFamily>(gpt_config_from_json(config, origin), overrides);
}

}  // namespace spanformer::train
