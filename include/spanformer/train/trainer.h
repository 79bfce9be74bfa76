// Training loop, as the reference's (facebookresearch/adaptive-span, trainer.py + main.py), plus exact
// resume.
//
// Data: B contiguous streams of the train split; step k reads block [pos, pos + M) of every stream,
// caches carry over from block to block; when pos >= S - M the run restarts at a random offset in
// [0, M) with all caches zeroed. Each step: forward, NLL + span loss, backward (batch_split groups of
// B / batch_split streams accumulate gradients), learning rate with linear warmup, optimizer step,
// span clamp. Every eval_interval steps: eval_blocks validation blocks (continuing stream and caches),
// one log record, a checkpoint.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "spanformer/config/config.h"
#include "spanformer/data/corpus.h"
#include "spanformer/dist/group.h"
#include "spanformer/models/transformer_seq.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/optim.h"

namespace spanformer::train {

// One optimizer step over inputs/targets (B, M); caches (B, C_l, H) are replaced by the next block's.
// Returns the mean NLL in nats (0-dim tensor, no host synchronisation).
// With a process group, gradients are averaged over the ranks (each rank passes its share of streams):
// by `reducer` during the last backward pass when given, else in one bucket after it.
torch::Tensor train_step(models::TransformerSeq& model, Optimizer& optimizer, const torch::Tensor& x,
                         const torch::Tensor& y, std::vector<torch::Tensor>& caches, int64_t batch_split, double lr,
                         dist::Group* group = nullptr, dist::GradientReducer* reducer = nullptr);

OptimizerOptions optimizer_options(const TrainConfig& config);

// "cpu", "cuda", "cuda:1" -> a device; a clear error when CUDA is asked for but absent.
torch::Device parse_device(const std::string& name);

struct RunOptions {
  std::string out_dir;         // config.json, log.jsonl, checkpoint.pt
  bool resume = false;         // continue from out_dir/checkpoint.pt
  bool progress = true;        // live progress line on stderr
  int64_t stop_after = -1;     // stop (with a checkpoint) after this many steps of this session; -1 = run to nb_steps
  std::string init_from;       // new run only: start from this checkpoint's weights (same model config)
  std::shared_ptr<dist::Group> group;  // data-parallel run: this process's group (null = one process)
};

struct RunResult {
  int64_t steps = 0;          // the run's step count at the end
  int64_t session_steps = 0;  // steps done by this call
  double last_train_bpc = 0, last_valid_bpc = 0;
  bool interrupted = false;
};

// Trains; throws Error for bad data/config/checkpoint and for a non-finite loss.
RunResult run_training(const Config& config, const RunOptions& options);

}  // namespace spanformer::train
