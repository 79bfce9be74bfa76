#include "spanformer/ops/masked_softmax.h"

#include <fmt/ranges.h>

#include <limits>

#include "spanformer/util/error.h"

namespace spanformer::ops {

at::Tensor valid_length_mask(const at::Tensor& valid, int64_t B, int64_t N, int64_t C, const at::Device& device) {
  if (at::isFloatingType(valid.scalar_type()) || valid.scalar_type() == at::kBool)
    fail("masked_softmax: valid lengths must be integers (got {})", c10::toString(valid.scalar_type()));
  const bool per_query = valid.dim() == 2;
  if (!(valid.dim() == 1 && valid.size(0) == B) && !(per_query && valid.size(0) == B && valid.size(1) == N))
    fail("masked_softmax: valid lengths must be (B) = ({}) or (B, N) = ({}, {}) (got {})", B, B, N,
         fmt::join(valid.sizes(), "x"));
  if (valid.numel() > 0 && (valid.min().item<int64_t>() < 0 || valid.max().item<int64_t>() > C))
    fail("masked_softmax: valid lengths must lie in [0, {}] (got {} .. {})", C, valid.min().item<int64_t>(),
         valid.max().item<int64_t>());
  auto v = valid.to(device, at::kLong);
  v = per_query ? v.unsqueeze(-1) : v.view({B, 1, 1});                                            // (B, N or 1, 1)
  return at::arange(C, at::TensorOptions().dtype(at::kLong).device(device)).view({1, 1, C}) < v;  // (B, N or 1, C)
}

at::Tensor masked_softmax(const at::Tensor& scores, const at::Tensor& valid) {
  if (!valid.defined()) return at::softmax(scores, -1);
  const int64_t rank = scores.dim();
  if (rank != 3 && rank != 4) fail("masked_softmax: scores must be (B, N, C) or (B, K, N, C) (got {} dims)", rank);
  auto keep = valid_length_mask(valid, scores.size(0), scores.size(-2), scores.size(-1), scores.device());
  return softmax_where(scores, rank == 4 ? keep.unsqueeze(1) : keep);  // keep (B, [1,] N or 1, C)
}

at::Tensor softmax_where(const at::Tensor& scores, const at::Tensor& keep) {
  if (keep.scalar_type() != at::kBool)
    fail("softmax_where: the keep mask must be bool (got {})", c10::toString(keep.scalar_type()));
  // Masked scores take the lowest finite value, so a row with no key is uniform before the final
  // product with `keep` zeroes it (a -inf fill would make it 0/0).
  const double lowest = scores.scalar_type() == at::kDouble ? std::numeric_limits<double>::lowest()
                        : scores.scalar_type() == at::kHalf ? -65504.0
                        : scores.scalar_type() == at::kBFloat16
                            ? -3.38e38
                            : static_cast<double>(std::numeric_limits<float>::lowest());
  auto filled = scores.masked_fill(keep.logical_not(), lowest);    // (B, [K,] N, C)
  return at::softmax(filled, -1) * keep.to(scores.scalar_type());  // (B, [K,] N, C): rows with no key are 0
}

}  // namespace spanformer::ops
