// Gradient averaging over a process group, overlapped with backward (dist/group.h has the group).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "spanformer/dist/group.h"

namespace spanformer::dist {

// Averages gradients over the ranks while the backward pass runs (what PyTorch's DDP Reducer does).
// Parameters are cut into buckets of about `bucket_bytes`, in reverse registration order (the order in
// which backward finishes them). A hook on each parameter copies its finished gradient (what was
// already accumulated in .grad plus the incoming one) into its bucket; a full bucket starts an
// asynchronous all-reduce on Gloo's threads while backward goes on. Buckets are started strictly in
// index order so every rank issues the same collectives in the same order; finish() fills the buckets
// of parameters that got no gradient, waits, and writes the means into .grad.
//
// Use: arm() before the backward pass that completes the step's gradients (the last of batch_split
// groups), backward, finish().
class GradientReducer {
 public:
  GradientReducer(std::shared_ptr<Group> group, const std::vector<at::Tensor>& params,
                  int64_t bucket_bytes = 1 << 20);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  void arm();
  void finish();
  int64_t nb_buckets() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace spanformer::dist
