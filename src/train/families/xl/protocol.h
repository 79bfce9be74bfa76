// The Transformer-XL family's protocol (models/xl.h), following kimiyoung/transformer-xl's train.py /
// eval.py, with the PAR architecture search on top; train/families/xl/family.cpp runs it on the engine.
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

namespace spanformer::train::xl {

double temperature(const XlSearchConfig& config, int64_t k, int64_t nb_steps);

struct EvalOptions {
  int64_t batch = 10, tgt_len = 128, max_segments = 0;  // 0 = the whole split
  int64_t first = 0, count = -1;  // this process's streams [first, first + count) of `batch` (-1: all)
  models::xl::Lengths lengths;
  std::string dump_logprobs;      // "" or a file: the log-probability of every scored token, in text order
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

}  // namespace spanformer::train::xl
