// The Transformer-XL / PAR family on the one engine (kimiyoung/transformer-xl's train.py / eval.py,
// with the PAR architecture search).
//
// Segment k reads tokens [pos - e, pos + M) of every stream (e = min(ext_len, pos) re-read tokens,
// not scored); memories carry over between segments; at the end of the data: position 0, memories
// emptied (an epoch). Step: mean NLL over B x M (+ span loss) -> backward (batch_split groups
// accumulate) -> gradient mean over processes -> clip the global norm to grad_clip -> the optimizer;
// a super-network's alpha has its own Adam (arch_lr, arch_weight_decay), frozen for the first
// arch_freeze_steps steps; one Gumbel noise sample per block per step, shared by the batch.
// Validation: eval_blocks segments of the valid split from fresh memories (0 = all of it).
#include "train/families/families.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "spanformer/config/xl_config.h"
#include "spanformer/dist/group.h"
#include "spanformer/io/xl_reference.h"
#include "spanformer/models/par.h"
#include "spanformer/models/xl.h"
#include "spanformer/nn/gumbel.h"
#include "spanformer/train/optim.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"
#include "train/families/xl/protocol.h"

namespace spanformer::train {
namespace {

using models::xl::XlModel;

// Token ids with Zipf-like frequencies (P(id) ~ 1 / (id + 1), ids in frequency order as in a prepared
// vocabulary): the adaptive softmax then sees clusters as often as on real text.
torch::Tensor zipf_tokens(int64_t V, at::IntArrayRef sizes, torch::Device device) {
  auto u = torch::rand(sizes, torch::kDouble);
  return (torch::exp(u * std::log(static_cast<double>(V))) - 1).floor().clamp(0, V - 1).to(torch::kLong).to(device);
}

class XlFamily : public ConfiguredFamily<XlConfig>,
                  public TokenStreams,
                  public Sampling,
                  public Spans,
                  public AttentionPictures,
                  public ReferenceWeights,
                  public ArchitectureSearch {
 public:
  using ConfiguredFamily::ConfiguredFamily;

  const char* name() const override { return "xl"; }
  void set_vocab_size(int64_t V, const std::string& origin) override { fill_vocab_size(config_.model.vocab_size, V, origin); }
  std::string model_difference(const nlohmann::json& checkpoint_config) const override {
    return spanformer::model_difference(config_, xl_config_from_json(checkpoint_config, "checkpoint"));
  }

  void build() override {
    spanformer::validate(config_.model);
    model_ = XlModel(config_.model);
  }
  torch::nn::Module& module() override { return *model_; }

  void make_optimizers() override {
    optimizer_ = std::make_unique<Optimizer>(model_->weight_parameters(), optimizer_options(config_.train));
    if (config_.model.search) {
      OptimizerOptions a;
      a.kind = OptimKind::kAdam;
      a.weight_decay = config_.search.arch_weight_decay;
      arch_ = std::make_unique<Optimizer>(model_->arch_parameters(), a);
    }
  }
  void save_optimizers(CheckpointWriter& out) const override {
    optimizer_->save(out, "optim.");
    if (arch_) arch_->save(out, "arch_optim.");
  }
  void load_optimizers(const Checkpoint& in) override {
    optimizer_->load(in, "optim.");
    if (arch_) arch_->load(in, "arch_optim.");
  }

  int64_t block_length() const override { return config_.model.tgt_len; }
  int64_t context(int64_t pos) const override { return std::min(config_.model.ext_len, pos); }
  DataRestart data_restart() const override { return DataRestart::kEpoch; }

  void init_state(int64_t streams) override {
    streams_ = streams;
    reset_train_state();
  }
  void reset_train_state() override {
    mems_ = model_->initial_mems(streams_);
    for (auto& m : mems_) m = m.to(device());
  }

  torch::Tensor train_step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) override {
    const double tau = config_.model.search ? xl::temperature(config_.search, ctx.step, config_.train.nb_steps) : 1.0;
    last_tau_ = tau;
    Optimizer* arch = arch_ && ctx.step > config_.search.arch_freeze_steps ? arch_.get() : nullptr;
    return step(x, y, ctx, arch, tau);
  }

  double validation_loss(const data::TokenFile& valid, int64_t batch, int64_t first, int64_t count, int64_t&) override {
    xl::EvalOptions o;
    o.batch = batch;
    o.first = first;
    o.count = count;
    o.tgt_len = config_.model.tgt_len;
    o.lengths = models::xl::Lengths::of(config_.model);
    o.max_segments = config_.train.eval_blocks;
    return xl::evaluate(model_, valid, o).nll();
  }

  void save_state(CheckpointWriter& out, const std::function<torch::Tensor(const torch::Tensor&)>& gather) override {
    out.put_int("state.nb_mems", static_cast<int64_t>(mems_.size()));
    save_stream_state(out, "mem", mems_, gather);
  }
  void load_state(const Checkpoint& in, int64_t batch, int64_t first, int64_t count) override {
    const auto N = static_cast<int64_t>(model_->blocks().size());
    if (in.integer("state.nb_mems") != N) fail("checkpoint {} holds memories for another number of blocks", in.path());
    streams_ = count;
    mems_ = load_stream_state(in, "mem", N, config_.model.d_model, config_.model.mem_len + config_.model.tgt_len, batch,
                              first, count, device());
  }

  void log_extras(int64_t, nlohmann::json& record, std::string& text) override {
    if (config_.model.search) {
      const auto rows = block_probs();
      std::string argmax;
      for (const auto& p : rows) argmax += "afi"[std::max_element(p.begin(), p.end()) - p.begin()];
      record["tau"] = last_tau_;
      record["probs"] = rows;
      record["argmax"] = argmax;
      text += fmt::format(" | tau {:.3f} | argmax {}", last_tau_, argmax);
    }
    if (config_.model.adapt_span) log_spans(model_->spans(), record, text);
  }

  // ---- ArchitectureSearch -------------------------------------------------------------------------
  std::vector<std::array<double, 3>> block_probs() const override {
    std::vector<std::array<double, 3>> rows;
    if (!config_.model.search) return rows;
    auto p = model_->probs().to(torch::kCPU, torch::kDouble).contiguous();  // (N, 3)
    const double* d = p.data_ptr<double>();
    for (int64_t b = 0; b < p.size(0); ++b) rows.push_back({d[3 * b], d[3 * b + 1], d[3 * b + 2]});
    return rows;
  }
  nlohmann::json derived_config(const std::string& layers) const override {
    return to_json(models::par::derived_config(config_, layers));
  }

  EvalReport evaluate(const data::TokenFile& tokens, const EvalRequest& r) override {
    auto o = xl::eval_options(config_);
    if (r.batch > 0) o.batch = r.batch;
    const int64_t world = r.group ? r.group->world() : 1, rank = r.group ? r.group->rank() : 0;
    if (o.batch % world != 0) fail("the evaluation batch ({}) must divide by the number of processes ({})", o.batch, world);
    if (!r.dump_logprobs.empty() && world > 1) fail("--dump-logprobs runs in one process");
    o.count = o.batch / world;
    o.first = rank * o.count;
    o.dump_logprobs = r.dump_logprobs;
    auto result = xl::evaluate(model_, tokens, o, r.progress);
    double nll_sum = result.nll_sum;
    int64_t scored = result.tokens;
    if (r.group) {
      nll_sum = r.group->all_reduce_sum(nll_sum);
      scored = static_cast<int64_t>(r.group->all_reduce_sum(static_cast<double>(scored)));
    }
    EvalReport report;
    report.nll = nll_sum / static_cast<double>(scored);
    report.tokens = scored;
    report.blocks = result.segments;
    report.details = fmt::format("{} tokens, {} segments; tgt_len {}, mem_len {}, clamp_len {}, same_length {}, batch {}",
                                 scored, result.segments, o.tgt_len, o.lengths.mem_len, o.lengths.clamp_len,
                                 o.lengths.same_length, o.batch);
    return report;
  }

  // Memory-carrying sampling: the prompt in segments of tgt_len, then one token per forward step
  // against the memories (mem_len states per block), so each token costs one step.
  void sample(const data::Vocab& vocab, const SampleRequest& r) override {
    sample_tokens(vocab, r, config_.model.tgt_len, streaming_forward(),
                  [&](const torch::Tensor& last) { return model_->log_prob(last); }, device());
  }

  void draw_attention(const AttentionRequest& r) override {
    if (r.vocab == nullptr) fail("attention: no vocabulary given");
    draw_text_attention(*r.vocab, r, config_.model.tgt_len, streaming_forward(), device());
  }

  std::vector<std::vector<double>> spans() const override {
    if (!config_.model.adapt_span) return {};
    return model_->spans();
  }
  int64_t span_limit() const override { return config_.model.span_limit(); }
  int64_t span_ramp() const override { return config_.model.adapt_span_ramp; }

  void bench(const BenchRequest& r) override;

  void import_weights(const std::string& kind, const std::string& path) override {
    if (kind != "transformer-xl") unsupported("import from " + kind);
    io::load_xl_state_dict(model_, path);
  }
  void export_weights(const std::string& kind, const std::string& path) override {
    if (kind != "transformer-xl") unsupported("export to " + kind);
    io::save_xl_state_dict(model_, path);
  }

 private:
  // One stream read in evaluation mode, its memories carried from call to call (sampling, pictures).
  std::function<torch::Tensor(const torch::Tensor&)> streaming_forward() {
    model_->eval();
    auto mems = std::make_shared<std::vector<torch::Tensor>>(model_->initial_mems(1));
    for (auto& m : *mems) m = m.to(device());
    auto lengths = models::xl::Lengths::of(config_.model);
    lengths.ext_len = 0;
    auto weights = config_.model.search ? model_->eval_weights() : torch::Tensor();
    return [this, mems, lengths, weights](const torch::Tensor& x) { return model_->forward(x, *mems, lengths, weights); };
  }
  torch::Device device() const { return model_->word_emb->tables[0].device(); }

  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx, Optimizer* arch, double tau) {
    model_->train();
    optimizer_->zero_grad();
    const bool search = config_.model.search;
    if (search && model_->alpha.grad().defined()) model_->alpha.mutable_grad().zero_();
    // One noise sample per block for the whole step (all stream groups see the same architecture).
    torch::Tensor noise = search ? nn::gumbel_noise(model_->alpha.sizes(), model_->alpha.options()) : torch::Tensor();
    const int64_t Q = x.size(1), scored = config_.model.tgt_len;
    const auto lengths = models::xl::Lengths::of(config_.model);
    auto loss = accumulate_gradients(
        x.size(0), config_.train.batch_split, mems_, ctx, model_->parameters(),
        [&](int64_t first, int64_t count, std::vector<torch::Tensor>& part) {
          auto w = search ? nn::gumbel_softmax(model_->alpha, noise, tau, config_.model.search_hard) : torch::Tensor();
          auto h = model_->forward(x.narrow(0, first, count), part, lengths, w);                 // (b, Q, H)
          auto nll = model_->nll(h.narrow(1, Q - scored, scored), y.narrow(0, first, count).narrow(1, Q - scored, scored)).mean();
          return std::pair{nll, nll + model_->span_loss()};
        });
    optimizer_->step(ctx.lr);
    if (arch) arch->step(config_.search.arch_lr);
    model_->clamp_spans();
    return loss;
  }

  XlModel model_{nullptr};
  std::unique_ptr<Optimizer> arch_;  // the architecture weights' optimizer (search); optimizer_: the rest
  std::vector<torch::Tensor> mems_;
  int64_t streams_ = 0;
  double last_tau_ = 1.0;
};

void XlFamily::bench(const BenchRequest& r) {
  if (r.mode == BenchMode::kGenerate) unsupported("bench --mode generate");
  if (!r.eval() && (r.has("mem-len") || r.has("tgt-len"))) fail("bench: --mem-len and --tgt-len are for --mode eval");
  const double span = bench_span(r);
  const std::string span_dist = bench_span_dist(r);
  if (span >= 0 || !span_dist.empty()) {  // every head's span, or a span layout, for models with adapt_span
    if (!config_.model.adapt_span) fail("bench: --span and --span-dist need adapt_span");
    if (span >= 0) config_.model.adapt_span_init = std::min(1.0, span / static_cast<double>(config_.model.span_limit()));
  }
  if (config_.model.vocab_size == 0) {  // random tokens: any vocabulary the cutoffs fit in
    config_.model.vocab_size =
        config_.model.adaptive && !config_.model.cutoffs.empty() ? config_.model.cutoffs.back() * 4 / 3 + 1 : 10000;
    fmt::print(stderr, "bench: vocab_size {} (set --vocab_size to the data's)\n", config_.model.vocab_size);
  }
  validate();
  torch::manual_seed(config_.train.seed);
  build();
  if (span_dist == "bimodal") {
    std::vector<torch::Tensor> ratios;
    for (auto& a : model_->attn)
      if (a) ratios.push_back(a->span->span_ratio);
    set_bimodal_spans(ratios, static_cast<double>(config_.model.span_limit()));
  }
  model_->to(r.device);
  const int64_t V = config_.model.vocab_size;
  const std::string span_note =
      !config_.model.adapt_span ? ""
      : span_dist.empty()      ? fmt::format(", adaptive span z {:.0f}, attention {}", config_.model.adapt_span_init * config_.model.span_limit(), attention::attn_impl_name(config_.model.attn_impl))
                               : fmt::format(", adaptive spans {}, attention {}", span_dist, attention::attn_impl_name(config_.model.attn_impl));
  int64_t params = 0;
  for (auto& p : model_->weight_parameters()) params += p.second.numel();
  const auto& c = config_.model;
  if (!r.eval()) {
    make_optimizers();
    const int64_t B = config_.train.batch_size, M = c.tgt_len;
    init_state(B);
    const StepContext ctx = bench_context(config_.train, r.device);
    const double per_step = time_steps(r, [&] {
      auto x = zipf_tokens(V, {B, M}, device()), y = zipf_tokens(V, {B, M}, device());
      step(x, y, ctx, arch_.get(), 1.0).item<double>();
    });
    report_bench(r, name(), "bench xl train",
                 fmt::format("blocks {} ({}), H {}, K {}x{}, I {}, M {}, mem {}, B {}, V {}, {:.1f}M weights, threads {}{}",
                             model_->blocks().size(), c.search ? "super-network" : blocks_text(model_->blocks()), c.d_model,
                             c.n_head, c.d_head, c.d_inner, M, c.mem_len, B, V, static_cast<double>(params) / 1e6,
                             r.threads, span_note),
                 fmt::format("{:.1f} ms/step, {:.0f} tokens/s", per_step * 1e3, static_cast<double>(B * M) / per_step),
                 {{"mode", "train"}, {"ms_per_step", per_step * 1e3}, {"tokens_per_s", static_cast<double>(B * M) / per_step},
                  {"weights", params}});
    return;
  }
  // Evaluation speed with a full memory: the protocol's tgt_len and mem_len (or the flags').
  auto options = xl::eval_options(config_);
  options.lengths.mem_len = r.integer("mem-len", options.lengths.mem_len);
  options.tgt_len = r.integer("tgt-len", options.tgt_len);
  if (options.lengths.mem_len < 0 || options.tgt_len < 1) fail("bench: --mem-len must be >= 0 and --tgt-len >= 1");
  check_xl_segment_fits(c, static_cast<double>(options.batch), options.tgt_len, options.lengths.mem_len, "--tgt-len");
  const int64_t B = options.batch, M = options.tgt_len;
  torch::NoGradGuard no_grad;
  model_->eval();
  auto mems = model_->initial_mems(B);
  auto weights = c.search ? model_->eval_weights() : torch::Tensor();
  // A full memory (random states: the cost does not depend on their values), then timed segments.
  for (size_t b = 0; b < mems.size(); ++b)
    mems[b] = model_->blocks()[b] != BlockKind::kFeedForward
                  ? torch::randn({B, options.lengths.mem_len, c.d_model}, torch::TensorOptions().device(device()))
                  : mems[b].to(device());
  const double per_segment = time_steps(r, [&] {
    auto x = zipf_tokens(V, {B, M}, device()), y = zipf_tokens(V, {B, M}, device());
    auto h = model_->forward(x, mems, options.lengths, weights);
    model_->nll(h, y).sum().item<double>();
  });
  const double tokens = static_cast<double>(B * M);
  report_bench(r, name(), "bench xl eval",
               fmt::format("blocks {} ({}), H {}, K {}x{}, I {}, tgt_len {}, mem_len {}, B {}, V {}, threads {}{}",
                           model_->blocks().size(), c.search ? "super-network" : blocks_text(model_->blocks()), c.d_model, c.n_head,
                           c.d_head, c.d_inner, M, options.lengths.mem_len, B, V, r.threads, span_note),
               fmt::format("{:.1f} ms/segment, {:.4f} ms/token, {:.0f} tokens/s", per_segment * 1e3,
                           per_segment * 1e3 / tokens, tokens / per_segment),
               {{"mode", "eval"}, {"ms_per_segment", per_segment * 1e3}, {"ms_per_token", per_segment * 1e3 / tokens},
                {"tokens_per_s", tokens / per_segment}, {"mem_len", options.lengths.mem_len}, {"tgt_len", M}});
}

}  // namespace

std::vector<BenchSetting> xl_bench_settings() {
  auto settings = span_bench_settings();
  settings.push_back({"mem-len", "eval mode: memory length (default: the protocol's eval_mem_len)"});
  settings.push_back({"tgt-len", "eval mode: segment length (default: the protocol's eval_tgt_len)"});
  return settings;
}

std::unique_ptr<Family> make_xl_family(const nlohmann::json& config, const std::string& origin,
                                       const std::vector<std::string>& overrides) {
  return configured_family<XlFamily>(xl_config_from_json(config, origin), overrides);
}

}  // namespace spanformer::train
