// The one engine's family interface: what differs between model families (adaptive span,
// Transformer-XL/PAR, and the families still to come); everything they share lives in the Runner
// (train/runner.h), the checkpoint format (train/checkpoint.h), the shared `train` config section
// (config/train_config.h) and the command registry (cli/).
//
//   cli command ──> open_family(config | checkpoint) ──> Family ──> model (models/*)
//        │                                                  ▲
//        └──> Runner (data streams, seeds, resume/--init, signals, progress + log, checkpoints,
//                     NaN guard, validation cadence, process group + gradient reducer)
//
// A family owns its config, its model, its optimizers and its recurrent training state (caches or
// memories carried from block to block). The Runner calls it through this interface only.
#pragma once
#include <ATen/core/Generator.h>
#include <torch/nn/module.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "spanformer/config/train_config.h"
#include "spanformer/data/corpus.h"
#include "spanformer/metrics/bleu.h"
#include "spanformer/train/checkpoint.h"

namespace spanformer::dist {
class Group;
class GradientReducer;
}  // namespace spanformer::dist

namespace spanformer::train {

// What the Runner hands to one optimizer step.
struct StepContext {
  int64_t step = 1;        // update number k (from 1)
  double lr = 0;           // learning rate of this update (config/train_config.h)
  dist::Group* group = nullptr;
  dist::GradientReducer* reducer = nullptr;
  Amp amp = Amp::kOff;                                // train.amp: the forward under autocast
  c10::DeviceType device_type = c10::DeviceType::CPU;  // the device autocast applies to
  // The family calls this just before the backward pass that completes the gradients, and
  // reduce_gradients() after it: the gradients are then the mean over every process's streams.
  void before_last_backward() const;
  void reduce_gradients(const std::vector<torch::Tensor>& params) const;
};

// How training walks token streams (TokenStreams): contiguous streams that restart when a stream has
// no full block left, or independent contexts.
enum class DataRestart {
  kRandomOffset,    // adaptive span (the reference's rule): a random offset in [0, M), state zeroed
  kEpoch,           // Transformer-XL (kimiyoung's iterator): position 0, memories emptied
  kRandomContexts,  // GPT: every step draws B context starts uniformly in [0, n - M - 1] (torch's CPU
                    // generator, saved in checkpoints), no state carried
};

// A data set of examples (ExampleSets), as the family opened it.
struct ExampleData {
  data::Vocab vocab;                 // what checkpoints keep as the vocabulary (class names for ViT)
  int64_t train_size = 0, valid_size = 0;
  std::string train_fingerprint, valid_fingerprint;  // what a resumed run checks its data against
  std::string item = "examples";     // what the speed counts ("images": images_per_s)
  std::string scored = "examples";   // what a score's count counts (seq2seq: target tokens)
};

// Scores summed over examples, so that processes' shares add up.
struct ExampleScore {
  // The sum of every process's score (`group` null: this one alone); every process calls it.
  void all_reduce(dist::Group* group);
  double nll_sum = 0;   // nats
  double correct = 0;   // examples (or tokens) predicted right
  double count = 0;     // examples (or tokens) scored
  std::optional<metrics::BleuStats> bleu;  // translation families: corpus BLEU statistics (additive)
  // With `full`: one line per scored example, in split order, "expected<TAB>produced" (seq2seq: the
  // normalised reference and the translation; ViT: the label and the predicted class), for eval
  // --dump-outputs (an outside scorer, e.g. sacrebleu, reads them).
  std::vector<std::string> outputs;
};

// Full-evaluation result, in nats; `unit` figures derive from it.
struct EvalReport {
  double nll = 0;          // the family's protocol: mean over blocks (adaptive span) or over tokens (XL)
  int64_t tokens = 0, blocks = 0;
  std::string details;     // protocol lengths etc., for the one-line report
  double accuracy = -1;    // example families: the share classified right (-1: none)
};

struct EvalRequest {
  int64_t batch = -1;       // streams (-1: the config's eval_batch_size)
  std::function<void(int64_t, int64_t)> progress;
  dist::Group* group = nullptr;
  std::string dump_logprobs;  // "" or a file: one log-probability per scored token, in order
};

struct SampleRequest {
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  bool bfloat16 = false;     // the weights cast to bfloat16 once, every step in bfloat16 (gpt family)
  std::function<void(const std::string&)> on_text;
};

// `spanformer translate`: decoding options (-1: the config's).
struct TranslateRequest {
  int64_t beam = -1;
  double length_penalty = -1;
};

// `spanformer bench`: what every family's bench takes, and the family's own settings.
enum class BenchMode { kTrain, kEval, kGenerate };
const char* bench_mode_name(BenchMode mode);  // "train" | "eval" | "generate"
BenchMode parse_bench_mode(const std::string& name);

struct BenchRequest {
  bool json = false;            // one JSON record on stdout instead of the two text lines
  BenchMode mode = BenchMode::kTrain;  // train step | forward only, no gradients | generation (GPT)
  int64_t steps = 5, warmup = 2;
  torch::Device device = torch::kCPU;
  int threads = 1;              // as set, for the report
  // When set, the timed steps run under LibTorch's profiler: a Chrome trace of every ATen call goes to
  // this file (chrome://tracing, Perfetto) and a table of the operators by their own time to stderr.
  std::string profile;
  // The settings given on the command line (--span 64: {"span", "64"}), each one the family lists among
  // its bench settings (train/registry.h; refused otherwise before the family runs), read as:
  std::map<std::string, std::string> settings;
  bool has(const std::string& name) const { return settings.count(name) > 0; }
  double number(const std::string& name, double fallback) const;   // "bench: --name must be a number"
  int64_t integer(const std::string& name, int64_t fallback) const;
  std::string text(const std::string& name) const;                 // "" when not given
  bool eval() const { return mode == BenchMode::kEval; }
};

// `spanformer attention`: a picture of what a model attends to.
struct AttentionRequest {
  std::vector<int64_t> indices;  // images (ViT) or sentence pairs (seq2seq) of `split`
  std::vector<std::string> texts;  // seq2seq: source sentences; language models: one text
  const data::Vocab* vocab = nullptr;  // language models: the checkpoint's vocabulary
  std::string split = "test";
  int64_t layer = -1, head = -1;  // -1: every layer by attention rollout / the heads' mean
  std::string out;              // PNG ("": draw nothing, print nothing; `weights` only)
  // When set, receives the weights the picture is made of, float64 on the CPU:
  //   language models  one (1, K, n, S + 1) per layer, by distance (attention/record.h), for the text
  //   seq2seq          one per sentence: (L, K, T, S) for the Transformer, (T, S) for bahdanau/luong
  //                    (T = the decoded output with <eos>, S = the source tokens)
  //   vit              one (b, K, N, N) per layer for the b images (N = patches + the class token)
  std::vector<torch::Tensor>* weights = nullptr;
};

// ---- the core: what every family is ---------------------------------------------------------------
// Config, model, optimizers, one training step, log fields and `spanformer bench`. Everything else a
// family may or may not do is a capability below, reached as family.as<Spans>() (nullptr when absent)
// or family.need<Spans>() (fails "the <family> family has no <Spans::kWhat>"): commands and the Python
// bindings ask for the capability they use, and the data side is one of TokenStreams or ExampleSets.
class Family {
 public:
  virtual ~Family() = default;
  virtual const char* name() const = 0;  // the checkpoint's family tag and the config's arch

  // ---- config -----------------------------------------------------------------------------------
  virtual nlohmann::json config_json() const = 0;
  virtual TrainConfig& train() = 0;
  // The data's vocabulary size (the class count of example sets): fills a 0, refuses another.
  virtual void set_vocab_size(int64_t V, const std::string& origin) = 0;
  virtual void validate() const = 0;
  // A training step's working memory against the machine's, refused in one line (train, bench's train mode).
  virtual void check_training_step() const = 0;
  // The vocabulary of the checkpoint the family is read from (families that map text themselves keep it).
  virtual void set_vocabulary(const data::Vocab& vocab) { (void)vocab; }
  // Names the first model difference with a checkpoint's config ("" when the weights fit).
  virtual std::string model_difference(const nlohmann::json& checkpoint_config) const = 0;

  // ---- model and optimizers ---------------------------------------------------------------------
  virtual void build() = 0;  // the model from the config (torch seed set by the caller)
  virtual torch::nn::Module& module() = 0;
  virtual void make_optimizers() = 0;
  virtual void save_optimizers(CheckpointWriter& out) const = 0;
  virtual void load_optimizers(const Checkpoint& in) = 0;
  virtual void load_weights(const Checkpoint& in);  // checks model_difference first

  // ---- training ---------------------------------------------------------------------------------
  // One optimizer step on a batch (TokenStreams: inputs/targets (b, context + M); ExampleSets: what
  // example_batch made). Returns the mean NLL (0-dim, nats).
  virtual torch::Tensor train_step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) = 0;
  // Fields added to each log record and the progress line (spans, temperatures ...).
  virtual void log_extras(int64_t step, nlohmann::json& record, std::string& text) { (void)step, (void)record, (void)text; }
  // Prints the figures of `spanformer bench` (random inputs); builds the model itself.
  virtual void bench(const BenchRequest& request) = 0;

  // ---- capabilities -----------------------------------------------------------------------------
  template <typename C>
  C* as() { return dynamic_cast<C*>(this); }
  template <typename C>
  const C* as() const { return dynamic_cast<const C*>(this); }
  // The capability, or "the <family> family has no <what>" (default: C::kWhat).
  template <typename C>
  C& need(const std::string& what = C::kWhat) {
    if (auto* c = as<C>()) return *c;
    unsupported(what);
  }

 protected:
  // The vocab_size rule every family follows: 0 takes the data's V, another value must equal it.
  static void fill_vocab_size(int64_t& vocab_size, int64_t V, const std::string& origin);
  // Fails with "the <family> family has no <what>".
  [[noreturn]] void unsupported(const std::string& what) const;
};

// ---- the data side: exactly one of these two ------------------------------------------------------

// Language models: contiguous token streams (train.bin / valid.bin of a corpus directory). Inputs of a
// train step are block [pos - context(pos), pos + M) of each stream.
class TokenStreams {
 public:
  static constexpr const char* kWhat = "token-stream data";
  virtual ~TokenStreams() = default;
  virtual int64_t block_length() const = 0;  // M
  virtual int64_t context(int64_t pos) const { (void)pos; return 0; }
  virtual DataRestart data_restart() const = 0;
  // Recurrent state of `streams` local streams (B / processes); families without one (GPT's
  // independent contexts) keep these four no-ops.
  virtual void init_state(int64_t streams) { (void)streams; }
  virtual void reset_train_state() {}  // at a data restart
  // Recurrent state into / out of a checkpoint; `gather` turns a (local, ...) tensor into the
  // (B, ...) one of all processes (identity in one process).
  virtual void save_state(CheckpointWriter& out, const std::function<torch::Tensor(const torch::Tensor&)>& gather) {
    (void)out, (void)gather;
  }
  virtual void load_state(const Checkpoint& in, int64_t batch, int64_t first, int64_t count) {
    (void)in, (void)batch, (void)first, (void)count;
  }
  // Validation at an interval end on this process's streams [first, first + count) of `valid`
  // (B streams); `valid_pos` is the Runner's continuing position (families that restart ignore it).
  // Returns the mean NLL in nats.
  virtual double validation_loss(const data::TokenFile& valid, int64_t batch, int64_t first, int64_t count,
                                 int64_t& valid_pos) = 0;
  // The family's full evaluation protocol (`spanformer eval`).
  virtual EvalReport evaluate(const data::TokenFile& tokens, const EvalRequest& request) = 0;
};

// Labelled examples the family reads itself (ViT's images, seq2seq's sentence pairs): shuffled epochs,
// batch k of epoch e = examples perm_e[k B, (k + 1) B) with perm_e a permutation drawn from (seed, e)
// alone, so a resumed run reads the same batches without saved state.
class ExampleSets {
 public:
  static constexpr const char* kWhat = "example data";
  virtual ~ExampleSets() = default;
  // Reads the data set (train.data) and keeps it; fills the model's data-given sizes (classes).
  virtual ExampleData open_examples(const std::string& path) = 0;
  // Inputs and targets of train examples `ids` (this process's share of the batch), on `device`.
  virtual std::pair<torch::Tensor, torch::Tensor> example_batch(const std::vector<int64_t>& ids, torch::Device device) = 0;
  // Scores of part `part` of `parts` equal shares of a split (train | valid | test) of the open data:
  // `full` for the complete protocol of `eval` (seq2seq: beam search), else training's quick one.
  virtual ExampleScore score_examples(const std::string& split, int64_t part, int64_t parts, bool full = false) = 0;
  // Figures derived from a (summed) score, added to the record and the text line (BLEU, speeds).
  virtual void report_score(const ExampleScore& score, const std::string& prefix, nlohmann::json& record, std::string& text) {
    (void)score, (void)prefix, (void)record, (void)text;
  }
  // Reorders an epoch's permutation of the training examples (n) before it is cut into batches of
  // `batch` (seq2seq: length buckets); draws only from `generator`, so a resumed run gets the same order.
  virtual void arrange_epoch(torch::Tensor& order, int64_t batch, at::Generator& generator) {
    (void)order, (void)batch, (void)generator;
  }
};

// ---- optional capabilities ------------------------------------------------------------------------

// `spanformer generate`, Python's generate().
class Sampling {
 public:
  static constexpr const char* kWhat = "generation";
  virtual ~Sampling() = default;
  virtual void sample(const data::Vocab& vocab, const SampleRequest& request) = 0;
};

// Learned spans (`spanformer spans`, the log's span fields, Python's spans()).
class Spans {
 public:
  static constexpr const char* kWhat = "learned spans";
  virtual ~Spans() = default;
  // Per layer, per head learned spans in tokens (empty when this model learns none: adapt_span off).
  virtual std::vector<std::vector<double>> spans() const = 0;
  virtual int64_t span_limit() const = 0;  // L, the largest span
  virtual int64_t span_ramp() const = 0;   // R, the mask's ramp
};

// `spanformer translate`, Python's translate().
class Translation {
 public:
  static constexpr const char* kWhat = "translation";
  virtual ~Translation() = default;
  virtual std::vector<std::string> translate(const std::vector<std::string>& sentences, const TranslateRequest& request) = 0;
};

// `spanformer attention`, Python's attention().
class AttentionPictures {
 public:
  static constexpr const char* kWhat = "attention pictures";
  virtual ~AttentionPictures() = default;
  virtual void draw_attention(const AttentionRequest& request) = 0;
};

// `spanformer par derive`: a trained super-network's block-type probabilities and the plain model a
// rule (models/par.h) derives from them.
class ArchitectureSearch {
 public:
  static constexpr const char* kWhat = "architecture search";
  virtual ~ArchitectureSearch() = default;
  // Per block P(attention), P(feed-forward), P(identity); empty when the model is not a super-network.
  virtual std::vector<std::array<double, 3>> block_probs() const = 0;
  // The config of the plain model whose blocks are `layers` (one of "afi" per block), as JSON.
  virtual nlohmann::json derived_config(const std::string& layers) const = 0;
};

// Weights from / to another implementation's format (`kind`, e.g. "adaptive-span": the Python
// reference's state_dict), for `import` and `export`; a kind the family does not read is refused.
class ReferenceWeights {
 public:
  static constexpr const char* kWhat = "reference weights";
  virtual ~ReferenceWeights() = default;
  virtual void import_weights(const std::string& kind, const std::string& path) = 0;
  virtual void export_weights(const std::string& kind, const std::string& path) = 0;
};

// A family from a config file (its "arch"; none = adaptive-span) plus overrides, or from JSON.
std::unique_ptr<Family> family_from_config_file(const std::string& path, const std::vector<std::string>& overrides);
std::unique_ptr<Family> family_from_json(const nlohmann::json& config, const std::string& origin,
                                         const std::vector<std::string>& overrides = {});
// A family from a checkpoint, model built and weights loaded; overrides may change how the model runs
// (attn_impl, the evaluation protocol), never what it is.
std::unique_ptr<Family> family_from_checkpoint(const Checkpoint& checkpoint, const std::vector<std::string>& overrides = {});

// A weights-only checkpoint of the family's model (no optimizer or training state), written atomically.
void save_weights(Family& family, const data::Vocab& vocab, const std::string& path);

// Writes (streams, tokens) log-probabilities atomically, one per line, stream after stream (eval's
// --dump-logprobs, every family).
void write_logprobs(const std::string& path, const torch::Tensor& logprobs);

// Weight formats (safetensors, GPT-2, the reference implementations' state_dicts): train/formats.h.

// "cpu", "cuda", "cuda:1" -> a device; a clear error when CUDA is asked for but absent.
torch::Device parse_device(const std::string& name);
// The device a name means, without asking whether it is present ("tpu": refused in one line).
torch::Device device_named(const std::string& name);

}  // namespace spanformer::train
