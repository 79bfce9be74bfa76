// Internal to the dist library: the c10d objects behind a Group, and the collective wrapper that
// turns a peer's death or hang into one clear message.
#pragma once
#include "spanformer/util/torch_compat.h"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "spanformer/dist/group.h"
#include "spanformer/util/error.h"

namespace spanformer::dist {

using Collectives = compat::CollectiveBackend;  // Gloo or NCCL behind one interface

struct Group::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<Collectives> pg;
};

// Runs a collective and turns a failure (a peer that died or hung) into one clear message.
template <typename F>
void collective(const char* what, int rank, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    fail("rank {}: {} failed, another rank died or hung ({})", rank, what, one_line_message(e));
  }
}

}  // namespace spanformer::dist
