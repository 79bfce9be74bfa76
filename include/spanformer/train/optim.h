// Optimizers with the reference's exact update rules, their learning-rate schedule, and their state
// (saved in checkpoints so that a resumed run continues bit for bit).
//
// adagrad (reference utils.py, AdagradWithGradClip): per parameter tensor with gradient g,
//     n = ||g||;  lr_t = lr * (c / (n + 1e-10) if c > 0 and n > c else 1)
//     sum += g * g                      (the UNCLIPPED gradient)
//     p  -= lr_t * g / (sqrt(sum) + 1e-10)
// sgd: PyTorch SGD with momentum (buf = momentum * buf + g; p -= lr * buf), adam: PyTorch Adam
// (betas 0.9, beta2, eps 1e-8, optional L2 weight_decay added to the gradient), adamw: PyTorch AdamW
// (p *= 1 - lr * weight_decay before the Adam update, for matrices only: biases, LayerNorm gains and
// span ratios are not decayed, as in GPT-2 / nanoGPT); all three after global-norm clipping:
// g *= min(1, c / (||all g|| + 1e-6)).
//
// On the CPU (LibTorch 2.4 and later) each update is ATen's fused kernel for it (`_fused_adagrad_`, one call
// per tensor with its clipped rate; `_fused_adam_` / `_fused_adamw_` over all tensors at once, the global clip
// passed as their gradient scale): one vectorised pass over parameter, gradient and state, where the plain
// composition (`fused = false`, the reference the tests hold the fused path to) makes five to eight. On CUDA
// Adam and AdamW take ATen's multi-tensor kernels (one launch for all parameters) with the other fused
// step kernels' row, SPANFORMER_STEP_KERNELS=kernels (include/spanformer/ops/step_ops.h; the lab's:
// lab/lab.h). Elsewhere, and for sgd, the plain composition runs, with every scale factor on the device: no host
// synchronisation per tensor. The fused Adagrad reads each tensor's norm on the host, as the reference does.
#pragma once
#include <torch/serialize/archive.h>

#include <string>
#include <vector>

#include "spanformer/config/train_config.h"
#include "spanformer/train/checkpoint.h"

namespace spanformer::train {

struct OptimizerOptions {
  OptimKind kind = OptimKind::kAdagrad;
  double momentum = 0.0;
  double grad_clip = 0.0;        // 0 = no clipping
  double weight_decay = 0.0;     // adam: g += weight_decay * p (L2); adamw: decoupled, matrices only
  double beta2 = 0.999;          // adam / adamw
  bool fused = true;             // ATen's fused kernels where they apply (see above); false: the plain composition
};

class Optimizer {
 public:
  Optimizer(std::vector<std::pair<std::string, torch::Tensor>> named_params, OptimizerOptions options);

  void zero_grad();
  // One update with learning rate `lr` (schedule already applied). Parameters without gradient are skipped.
  void step(double lr);
  int64_t steps() const { return steps_; }
  // Whether the next step takes ATen's fused kernels (the gradients as they are now).
  bool runs_fused() const { return options_.fused && options_.kind != OptimKind::kSgd && fusable(); }

  // A step captured as a CUDA graph (the lab's lab/step_graph.h): the host's share of a step, outside the graph (the count;
  // the rate copied into a device tensor), and the device's, captured once and replayed (the count on the
  // device, then ATen's fused Adam / AdamW over every parameter reading the rate there). graph_refusal():
  // why these cannot run (empty: they can): Adam or AdamW, LibTorch 2.4 or later, parameters on one CUDA
  // device.
  std::string graph_refusal() const;
  void begin_graph_step(double lr);
  void graph_step();

  void save(CheckpointWriter& out, const std::string& prefix) const;
  void load(const Checkpoint& in, const std::string& prefix);

 private:
  struct Slot {
    std::string name;
    torch::Tensor param, state1, state2;  // adagrad: sum; sgd: momentum buffer; adam: m, v
  };
  bool fusable() const;  // every slot with a gradient fits ATen's fused kernels on its device
  void step_plain(double lr);
  void step_fused(double lr);
  template <typename Lr>
  void adam_fused(const Lr& lr, const at::Tensor& step);  // Adam / AdamW over every slot, lr a double or a tensor
  torch::Tensor graph_lr_, graph_steps_;  // a graphed step's: 0-dim float32 on the parameters' device
  std::vector<Slot> slots_;
  OptimizerOptions options_;
  int64_t steps_ = 0;
};


}  // namespace spanformer::train
