// Helpers the families share (internal to the library; the list of families is train/registry.h).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "spanformer/train/family.h"
#include "spanformer/train/registry.h"
#include "spanformer/train/optim.h"

namespace spanformer::train {

// The main optimizer's options from the shared train section.
OptimizerOptions optimizer_options(const TrainConfig& train);
// That optimizer over every named parameter of a model.
std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const TrainConfig& train);

namespace detail {
template <typename C>
void validate_config(const C& config) { validate(config); }  // spanformer::validate, found through C
template <typename C>
void check_step(const C& config) { check_training_step_fits(config); }
}  // namespace detail

// What every family does with its config C: holds it, writes it (to_json), validates it, and hands the
// runner its shared train section; and the one optimizer over every parameter that most families keep
// (saved under "optim."; a family with more overrides the three optimizer methods).
template <typename C>
class ConfiguredFamily : public Family {
 public:
  explicit ConfiguredFamily(C config) : config_(std::move(config)) {}
  nlohmann::json config_json() const override { return to_json(config_); }
  TrainConfig& train() override { return config_.train; }
  void validate() const override { detail::validate_config(config_); }
  void check_training_step() const override { detail::check_step(config_); }
  void make_optimizers() override { optimizer_ = make_optimizer(module(), config_.train); }
  void save_optimizers(CheckpointWriter& out) const override { optimizer_->save(out, "optim."); }
  void load_optimizers(const Checkpoint& in) override { optimizer_->load(in, "optim."); }

 protected:
  C config_;
  std::unique_ptr<Optimizer> optimizer_;
};

// A family F from its config (already read) with the command line's overrides applied.
template <typename F, typename C>
std::unique_ptr<Family> configured_family(C config, const std::vector<std::string>& overrides) {
  apply_overrides(config, overrides);
  return std::make_unique<F>(std::move(config));
}

// A prompt as token ids: bytes of a byte vocabulary, whitespace-separated words of a word vocabulary
// (unknown words become <unk> when the vocabulary has it, else are skipped). Never empty: <eos> or id 0.
std::vector<int64_t> prompt_ids(const data::Vocab& vocab, const std::string& prompt);

// The step context of `spanformer bench`'s training steps: a negligible learning rate, and train.amp on
// the request's device as the runner would set it.
inline StepContext bench_context(const TrainConfig& train, torch::Device device) {
  StepContext ctx;
  ctx.lr = 1e-9;
  ctx.amp = train.amp;
  ctx.device_type = device.type();
  return ctx;
}

// The span settings of bench (adaptive span, XL, GPT): their rows of the family's bench settings, and
// their values: --span (tokens, >= 0; -1 when not given) and --span-dist ("" or "bimodal").
std::vector<BenchSetting> span_bench_settings();
double bench_span(const BenchRequest& request);
std::string bench_span_dist(const BenchRequest& request);

// How many numbers the module's parameters hold (bench's "params": a twin in another library must match).
int64_t parameter_count(torch::nn::Module& module);

// Runs warmup + steps calls of `step`, printing each one's time on stderr; returns the mean seconds
// of the timed ones.
double time_steps(const BenchRequest& request, const std::function<void()>& step);

// A token model's bench steps on random ids below V: each draws x, y (B, T) on the device; in eval mode
// eval(x, y) runs the forward (no gradients), else train(x, y) runs one training step and returns its
// loss. The mean seconds a step, and the first step's loss before any update (null in eval mode).
struct TokenSteps {
  double per_step = 0;
  nlohmann::json first_loss;
};
TokenSteps time_token_steps(const BenchRequest& request, int64_t V, int64_t B, int64_t T, const torch::Device& device,
                            const std::function<void(const torch::Tensor&, const torch::Tensor&)>& eval,
                            const std::function<double(const torch::Tensor&, const torch::Tensor&)>& train);

// `spanformer bench`'s report: two lines on stdout, "<prefix>: <what>" and "<prefix>: <figures_text>,
// <peak memory>", or with request.json one JSON record {"family", "what", ...figures, "peak_rss_mb"}.
void report_bench(const BenchRequest& request, const char* family, const std::string& prefix, const std::string& what,
                  const std::string& figures_text, nlohmann::json figures);

// What every family's train step shares: the local streams in `split` groups, each group's forward
// and backward (`group_loss(first, count, state)` returns {mean NLL, loss to differentiate} for streams
// [first, first + count) with their slice of the recurrent state, which it updates), the state put back
// together, the gradients averaged over processes. Returns the mean NLL (0-dim).
using GroupLoss = std::function<std::pair<torch::Tensor, torch::Tensor>(int64_t, int64_t, std::vector<torch::Tensor>&)>;
torch::Tensor accumulate_gradients(int64_t streams, int64_t split, std::vector<torch::Tensor>& state,
                                   const StepContext& ctx, const std::vector<torch::Tensor>& params,
                                   const GroupLoss& group_loss);

// Recurrent state (one (B, T, width) tensor per layer or block, T <= max_length) into and out of a
// checkpoint under "state.<name>.<i>" (the caller records how many); reading checks shape, batch and
// finiteness, and keeps this process's streams [first, first + count).
void save_stream_state(CheckpointWriter& out, const std::string& name, const std::vector<torch::Tensor>& state,
                       const std::function<torch::Tensor(const torch::Tensor&)>& gather);
std::vector<torch::Tensor> load_stream_state(const Checkpoint& in, const std::string& name, int64_t n, int64_t width,
                                             int64_t max_length, int64_t batch, int64_t first, int64_t count,
                                             torch::Device device);

// Sampling every family shares: the prompt in blocks of `block`, then one token per step.
// `forward(x (1, n))` runs the model with its carried state and returns the last hidden state
// (1, 1, H); `scores(last)` gives logits or log-probabilities (V).
void sample_tokens(const data::Vocab& vocab, const SampleRequest& request, int64_t block,
                   const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                   const std::function<torch::Tensor(const torch::Tensor&)>& scores, torch::Device device);

// The attention picture every language-model family shares (`spanformer attention CHECKPOINT --text`):
// the text in blocks of `block` tokens through `forward` (which carries the model's state, as for
// sampling), the last block under an attention::WeightRecorder (reference compositions only), drawn as
// its last rows (at most 32 queries) over the distances 0 .. S any shown head weighs (binned to at most
// 360 columns, each the weight summed over its distances): one panel per layer (the heads' mean), per
// head of --layer, or the one --layer/--head.
void draw_text_attention(const data::Vocab& vocab, const AttentionRequest& request, int64_t block,
                         const std::function<torch::Tensor(const torch::Tensor&)>& forward, torch::Device device);

// Log fields of learned spans (mean and max per layer) and the progress line's span means.
void log_spans(const std::vector<std::vector<double>>& spans, nlohmann::json& record, std::string& text);

// Spans as adaptive-span models learn them (bench --span-dist bimodal): in each layer's span_ratio (K),
// 3 of 4 heads get z in [16, min(256, L)], 1 of 4 in [min(2048, L), L] (fixed seed).
void set_bimodal_spans(const std::vector<torch::Tensor>& span_ratios, double L);

}  // namespace spanformer::train
