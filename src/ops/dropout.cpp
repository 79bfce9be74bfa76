// Dropout's randomness (ops/dropout.h), and the seeds the ops' forward and backward pass between them
// (autograd_function.h).
#include "spanformer/ops/dropout.h"

#include <ATen/ATen.h>

#include <limits>

#include "autograd_function.h"
#include "dropout_hash.h"

namespace spanformer::ops {

uint64_t mix_seed(uint64_t x) { return splitmix64(x); }

uint64_t draw_dropout_seed() {
  return static_cast<uint64_t>(at::randint(std::numeric_limits<int64_t>::max(), {1}, at::kLong).item<int64_t>());
}

int64_t resolve_seed(int64_t seed, bool training, double dropout) {
  if (seed >= 0) return seed;
  return training && dropout > 0 ? static_cast<int64_t>(draw_dropout_seed()) : 0;
}

at::Tensor seed_tensor(int64_t seed, const at::Tensor& like) {
  return at::scalar_tensor(seed, like.options().dtype(at::kLong));  // () int64 on like's device
}

int64_t seed_value(const at::Tensor& seed, bool training, double dropout) {
  return training && dropout > 0 ? seed.item<int64_t>() : 0;
}

}  // namespace spanformer::ops
