// train.cuda_graphs: the training step as one CUDA graph (and `generate --cuda-graphs`: generation's
// per-token step, models/gpt.h). A step of a small model is a few hundred short
// kernels, and on a GPU their launches, not their arithmetic, set its time; a graph replays all of them
// with one launch (PyTorch's torch.cuda.graphs, CUDA's stream capture). The step runs eagerly for its
// first kWarmup calls (allocations, cuBLAS workspaces and the gradients' buffers made on the capture
// stream), is captured at the next with the batch copied into static buffers, and is replayed after
// that: each call copies the batch in, the family writes what the step reads from the host (the
// learning rate, the step count: GraphedSteps::begin_graph_step) and the graph runs. Everything runs on
// one side stream (capture needs one other than the default), autocast without its weight cache.
//
// What cannot be captured is refused before training, in one line: another device, several processes,
// a family without GraphedSteps, a step that reads the device on the host (its graph_refusal()). The
// first replay is held to the eager step bit for bit on a GPU (GraphCuda.ReplayEqualsEagerBitForBit).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>

namespace spanformer::train {

class StepGraph {
 public:
  static constexpr int64_t kWarmup = 3;
  // `device` must be a CUDA device; `warmup` eager calls before the capture (tests: a large number keeps
  // every call eager through the same code); `what` names the switch in its errors.
  explicit StepGraph(const torch::Device& device, int64_t warmup = kWarmup, const char* what = "train.cuda_graphs");
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // The result of one step on (x, y) (the loss; generation: the hidden state): step(x, y) eagerly, or its
  // captured graph replayed on copies of them.
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& y,
                    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& step);
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spanformer::train
