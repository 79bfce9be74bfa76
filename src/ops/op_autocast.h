// The span-aware, flash and LSH ops inside an autocast region (train.amp). Autocast does not know
// them, so each picks its compute dtype at its entry: the region's dtype on CUDA (the kernels read
// bf16 / fp16 and accumulate in float32) and on a CPU whose kernel for the op multiplies 16-bit
// operands natively (cpu_takes, ops/cpu/tile_gemm.h: AMX or AVX512-BF16); float32 on other CPUs (the
// kernels would widen 16-bit inputs anyway, and the compositions keep float32 or float64). Its floating inputs are cast to that dtype and autocast is off inside the op, so its own
// ATen calls run in that dtype too. Outside a region nothing changes (the inputs as they are).
#pragma once
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

#include "spanformer/util/torch_compat.h"

namespace spanformer::ops {

class OpAutocast {
 public:
  explicit OpAutocast(const at::Tensor& like, bool (*cpu_takes)(at::ScalarType) = nullptr) {
    const auto region = compat::autocast_dtype(like.device().type());
    if (!region) return;
    dtype_ = like.device().is_cuda() || (cpu_takes && like.device().is_cpu() && cpu_takes(*region)) ? *region : at::kFloat;
    exclude_.emplace(c10::autocast_dispatch_keyset);
  }
  // t in the op's compute dtype (floating tensors only, and only inside a region).
  at::Tensor operator()(const at::Tensor& t) const {
    return dtype_ && t.defined() && t.is_floating_point() && t.scalar_type() != *dtype_ ? t.to(*dtype_) : t;
  }

 private:
  std::optional<at::ScalarType> dtype_;
  std::optional<c10::impl::ExcludeDispatchKeyGuard> exclude_;
};

}  // namespace spanformer::ops
