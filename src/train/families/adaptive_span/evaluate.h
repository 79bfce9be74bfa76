// Evaluation, exactly as the reference's full_eval (trainer.py): fresh zero caches, the split cut into
// `batch` contiguous streams, blocks of M starting at 0, M, 2M, ... while start + M < stream length (the
// last incomplete block is skipped), and the result is the MEAN over blocks of each block's mean
// negative log-likelihood. bits per character = nats / ln 2; perplexity = exp(nats).
//
// One code path for every adaptive-span model: trained here or imported (the family's own protocol; the
// engine asks the family through Family::evaluate).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "spanformer/data/corpus.h"
#include "spanformer/dist/group.h"
#include "spanformer/models/transformer_seq.h"

namespace spanformer::train {

struct EvalResult {
  double nll = 0;      // mean over blocks of the per-block mean NLL, in nats
  int64_t blocks = 0;
  int64_t tokens = 0;  // targets scored
  double bpc() const;
  double ppl() const;
};

// Mean NLL (nats) of one block with the model in eval mode; updates caches. Returns a 0-dim tensor.
torch::Tensor eval_block(models::TransformerSeq& model, const torch::Tensor& x, const torch::Tensor& y,
                         std::vector<torch::Tensor>& caches);

// Full evaluation of a token file. `progress(done, total)` is called after each block when given.
// With a process group, rank r evaluates streams [r * batch / W, (r + 1) * batch / W) and the result
// is reduced (batch must divide by W); every rank returns the same figure.
// dump_logprobs: when not empty, the log-probability of every scored target is written there (one
// process only), one per line, in text order (stream after stream).
EvalResult evaluate(models::TransformerSeq& model, const data::TokenFile& tokens, int64_t batch,
                    const std::function<void(int64_t, int64_t)>& progress = nullptr, dist::Group* group = nullptr,
                    const std::string& dump_logprobs = "");

}  // namespace spanformer::train
