// The adaptive-span family's train step (facebookresearch/adaptive-span, trainer.py), used by the
// family on the engine (train/families/adaptive_span/family.cpp) and by tests that drive a model directly.
#pragma once
#include <vector>

#include "spanformer/models/transformer_seq.h"
#include "spanformer/train/family.h"
#include "spanformer/train/optim.h"

namespace spanformer::train {

// One optimizer step over inputs/targets (B, M); caches (B, C_l, H) are replaced by the next block's.
// batch_split groups of B / batch_split streams accumulate gradients; ctx averages them over processes.
// Returns the mean NLL in nats (0-dim tensor, no host synchronisation).
torch::Tensor train_step(models::TransformerSeq& model, Optimizer& optimizer, const torch::Tensor& x,
                         const torch::Tensor& y, std::vector<torch::Tensor>& caches, int64_t batch_split,
                         const StepContext& ctx);

}  // namespace spanformer::train
