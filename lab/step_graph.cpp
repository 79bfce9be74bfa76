// The lab's CUDA graphs (what and why: step_graph.h).
#include "step_graph.h"

#include "spanformer/util/error.h"

#ifdef SPANFORMER_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace spanformer::lab {

#ifdef SPANFORMER_WITH_CUDA

struct StepGraph::Impl {
  int64_t warmup, calls = 0;
  c10::cuda::CUDAStream stream;
  c10::cuda::CUDAStreamGuard guard;  // every step, copy and read on the side stream, from construction on
  bool cache_was_enabled;
  at::cuda::CUDAGraph graph;
  bool captured = false;
  torch::Tensor x, y, loss;  // the static buffers and the captured loss

  Impl(const torch::Device& device, int64_t warmup)
      : warmup(warmup),
        stream(c10::cuda::getStreamFromPool(false, device.index())),
        guard(stream),
        cache_was_enabled(at::autocast::is_autocast_cache_enabled()) {
    // Autocast's cache of cast weights would hand the graph tensors that a later step frees.
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~Impl() {
    stream.synchronize();  // the guard hands the next work to the default stream
    at::autocast::set_autocast_cache_enabled(cache_was_enabled);
  }
};

StepGraph::StepGraph(const torch::Device& device, int64_t warmup, const char* what) {
  if (!device.is_cuda()) fail("{} needs a CUDA device (the model is on {})", what, device.str());
  impl_ = std::make_unique<Impl>(device, warmup);
}

StepGraph::~StepGraph() = default;

bool StepGraph::captured() const { return impl_->captured; }

torch::Tensor StepGraph::run(const torch::Tensor& x, const torch::Tensor& y,
                             const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& step) {
  auto& g = *impl_;
  ++g.calls;
  if (g.calls <= g.warmup) return step(x, y);
  if (!g.captured) {
    g.x = x.clone();
    g.y = y.clone();
    g.stream.synchronize();
    g.graph.capture_begin();
    g.loss = step(g.x, g.y);
    g.graph.capture_end();
    g.captured = true;
    g.graph.replay();  // capture records the step; this runs it
    return g.loss;
  }
  g.x.copy_(x);
  g.y.copy_(y);
  g.graph.replay();
  return g.loss;
}

#else

struct StepGraph::Impl {};

StepGraph::StepGraph(const torch::Device& device, int64_t warmup, const char* what) {
  (void)warmup;
  if (!device.is_cuda()) fail("{} needs a CUDA device (the model is on {})", what, device.str());
  fail("{}: this build has no CUDA", what);
}
StepGraph::~StepGraph() = default;
bool StepGraph::captured() const { return false; }
torch::Tensor StepGraph::run(const torch::Tensor&, const torch::Tensor&,
                             const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>&) {
  fail("a CUDA graph: this build has no CUDA");
}

#endif

}  // namespace spanformer::lab
