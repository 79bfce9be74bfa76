// Training, evaluation and checkpoints of the Transformer-XL family (models/xl.h), following
// kimiyoung/transformer-xl's train.py / eval.py, with the PAR architecture search on top.
//
// Data: B contiguous streams (data::Streams); segment k reads tokens [pos - e, pos + M) of every
// stream (e = min(ext_len, pos) re-read tokens, not scored), memories carry over between segments;
// when a stream has no full segment left the epoch ends: pos = 0, memories emptied.
// Step: mean NLL over B x M (+ span loss) -> backward (batch_split groups accumulate) -> clip the
// global norm of the weights' gradient to grad_clip -> Adam with the schedule below; with a
// super-network, alpha has its own Adam (arch_lr, arch_weight_decay) and is not updated during the
// first arch_freeze_steps steps. One Gumbel noise sample per block per step, shared by the batch.
//
// Learning rate of update k = 1, 2, ...:  lr * k / warmup for k <= warmup, then
//   cosine: lr_min + (lr - lr_min) (1 + cos(pi k / nb_steps)) / 2,   constant: lr.
// (The reference sets the next step's rate after each step, so its first update uses the full lr;
// we apply the warmup from the first update.)
// Temperature of step k:  exp: tau0 (tau1 / tau0)^(k / nb_steps);  linear; constant tau0.
//
// Evaluation (eval.py): fresh memories, the split cut into B streams, segments of tgt_len from 0 to
// the end (the last one shorter), every target scored once: perplexity = exp(sum NLL / tokens),
// bits per character = sum NLL / tokens / ln 2.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "spanformer/config/xl_config.h"
#include "spanformer/data/corpus.h"
#include "spanformer/models/xl.h"
#include "spanformer/train/optim.h"

namespace spanformer::train::xl {

inline constexpr const char* kXlCheckpointFormat = "spanformer-xl-checkpoint-v1";

double temperature(const XlSearchConfig& config, int64_t k, int64_t nb_steps);

// One optimizer step. x, y (B, e + M) inputs/targets of which the last M are scored; mems replaced.
// arch: the alpha optimizer (null: alpha not updated this step). Returns the mean NLL (0-dim).
torch::Tensor train_step(models::xl::XlModel& model, Optimizer& optimizer, Optimizer* arch, const torch::Tensor& x,
                         const torch::Tensor& y, int64_t scored, std::vector<torch::Tensor>& mems, int64_t batch_split,
                         double lr, double arch_lr, double tau);

struct EvalOptions {
  int64_t batch = 10, tgt_len = 128, max_segments = 0;  // 0 = the whole split
  models::xl::Lengths lengths;
};
struct EvalResult {
  double nll_sum = 0;
  int64_t tokens = 0, segments = 0;
  double nll() const { return tokens ? nll_sum / static_cast<double>(tokens) : 0.0; }
  double ppl() const;
  double bpc() const;
};
EvalResult evaluate(models::xl::XlModel& model, const data::TokenFile& tokens, const EvalOptions& options,
                    const std::function<void(int64_t, int64_t)>& progress = nullptr);
// The evaluation protocol of a config (eval_* keys, falling back to the training lengths).
EvalOptions eval_options(const XlConfig& config);

struct TrainState {
  int64_t step = 0, train_pos = 0;
  std::vector<torch::Tensor> mems;  // (B, Mm, H) per block
  torch::Tensor rng_state, cuda_rng_state;
  double elapsed_seconds = 0;
};

void save_checkpoint(const std::string& path, const XlConfig& config, const data::Vocab& vocab,
                     models::xl::XlModel& model, const Optimizer* optimizer, const Optimizer* arch,
                     const TrainState* state);

// "spanformer-checkpoint-v1" (adaptive span), "spanformer-xl-checkpoint-v1", or "" (not ours).
std::string checkpoint_format(const std::string& path);

class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);
  const XlConfig& config() const { return config_; }
  const data::Vocab& vocab() const { return vocab_; }
  models::xl::XlModel load_model();
  void load_model_into(models::xl::XlModel& model);
  void load_optimizers(Optimizer& optimizer, Optimizer* arch);
  TrainState load_state(int64_t nb_blocks);

 private:
  std::string path_;
  torch::serialize::InputArchive archive_;
  XlConfig config_;
  data::Vocab vocab_;
};

struct RunOptions {
  std::string out_dir;
  bool resume = false, progress = true;
  int64_t stop_after = -1;
};
struct RunResult {
  int64_t steps = 0, session_steps = 0;
  double last_train = 0, last_valid = 0;  // in the data's unit (ppl for words, bpc for characters)
  std::string unit;
  bool interrupted = false;
};
RunResult run_training(const XlConfig& config, const RunOptions& options);

}  // namespace spanformer::train::xl
