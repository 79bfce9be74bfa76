// Data-parallel training on torch.distributed's engine (c10d): a TCPStore for rendezvous and a
// ProcessGroupGloo (CPU) or ProcessGroupNCCL (CUDA, one GPU per process: the node-local rank picks it)
// for collectives. No home-made networking.
//
// Launch conventions of the ecosystem are read as they are: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT (torchrun), or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID with MASTER_ADDR/MASTER_PORT set
// by the job script. `spanformer train --nproc-per-node N` spawns N local workers with those variables.
//
// Every collective has the group's timeout: a rank that dies or hangs makes the others fail with a
// clear message instead of waiting forever.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "spanformer/dist/backend.h"

namespace spanformer::dist {

struct GroupOptions {
  double timeout_seconds = 300;  // for rendezvous and every collective
  Backend backend = Backend::kAuto;
  bool cuda = false;             // the model runs on CUDA: auto means nccl
};

class Group {
 public:
  // The process group described by the environment; nullptr when WORLD_SIZE (or SLURM_NTASKS) is
  // unset, or 1 with the backend left to auto (a named backend gets a group of one). Throws Error for
  // an incomplete or inconsistent environment.
  static std::shared_ptr<Group> from_env(const GroupOptions& options);
  ~Group();

  int rank() const { return rank_; }
  int local_rank() const { return local_rank_; }
  // Where the collectives' tensors live: CPU for Gloo, cuda:LOCAL_RANK for NCCL (the model's device).
  c10::Device device() const { return device_; }
  int world() const { return world_; }
  bool is_main() const { return rank_ == 0; }

  // In place: every tensor becomes the mean over ranks (one flattened bucket, one all-reduce).
  void all_reduce_mean(const std::vector<at::Tensor>& tensors);
  double all_reduce_sum(double value);
  // Concatenation along dim 0 of every rank's tensor (same shape on every rank), in rank order.
  at::Tensor all_gather_cat(const at::Tensor& tensor);
  // Refuses to start when `text` (a config, a code version) differs from rank 0's.
  void check_same_as_main(const std::string& what, const std::string& text);
  void barrier();

  // Wall time spent waiting for collectives so far (for the log's allreduce_ms): with the
  // GradientReducer, only the part of the all-reduce that backward did not hide.
  double collective_seconds() const { return collective_seconds_; }

 private:
  friend class GradientReducer;
  double collective_seconds_ = 0;
  Group() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  c10::Device device_ = c10::Device(c10::DeviceType::CPU);
};

// The device this process runs on: `device` as configured, except that a bare "cuda" in a job of several
// processes means this process's GPU, cuda:LOCAL_RANK (torchrun's and SLURM's convention).
std::string process_device(const std::string& device, const Group* group);

}  // namespace spanformer::dist
