// Which c10d process group carries a data-parallel run's collectives (train.dist_backend).
#pragma once
#include <string>

namespace spanformer::dist {

enum class Backend {
  kAuto,  // gloo on the CPU, nccl on CUDA
  kGloo,
  kNccl,
};

// "auto" | "gloo" | "nccl"; parse fails with a one-line error naming the choices.
const char* backend_name(Backend backend);
Backend parse_backend(const std::string& name);

}  // namespace spanformer::dist
