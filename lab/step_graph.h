// The lab's CUDA graphs (lab.h): a step captured once as one CUDA graph and replayed, for the GPT's
// training step and generation's per-token step at fixed shapes (models/gpt.h), timed beside the eager
// steps by graph_perf.cpp (`spanformer_tests --graph-perf`, scripts/gpu-check.sh train_ab). A step of a
// small model is a few hundred short kernels, and on a GPU their launches, not their arithmetic, set its
// time; a graph replays all of them with one launch (PyTorch's torch.cuda.graphs, CUDA's stream
// capture). The step runs eagerly for its first kWarmup calls (allocations, cuBLAS workspaces and the
// gradients' buffers made on the capture stream), is captured at the next with the batch copied into
// static buffers, and is replayed after that: each call copies the batch in, the caller writes what the
// step reads from the host (the learning rate, the step count: Optimizer::begin_graph_step) and the graph
// runs. Everything runs on one side stream (capture needs one other than the default), autocast without
// its weight cache. The first replay is held to the eager step bit for bit on a GPU
// (GraphCuda.ReplayEqualsEagerBitForBit); until a GPU's figures show it faster it stays here, out of
// `train` and `generate`.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace spanformer::lab {

class StepGraph {
 public:
  static constexpr int64_t kWarmup = 3;
  // `device` must be a CUDA device; `warmup` eager calls before the capture (tests: a large number keeps
  // every call eager through the same code); `what` names the switch in its errors.
  explicit StepGraph(const torch::Device& device, int64_t warmup = kWarmup, const char* what = "a CUDA graph");
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

// spanformer_tests --graph-perf ARGS (graph_perf.cpp): the GPT's steps eager and as CUDA graphs, timed.
int graph_perf_main(const std::vector<std::string>& args);

}  // namespace spanformer::lab
