// Relative-position layout helpers (the reference's _skew/_unskew, facebookresearch/adaptive-span
// models.py). Dims: M queries, W distances; the context of a block is W earlier states then the M
// states of the block itself, and query i sees context positions i .. i + W - 1 (distances W .. 1).
//   unskew: (..., M, W + M) scores of query i against every context position -> (..., M, W) where
//           column j is context position i + j (distance W - j). A strided view, no copy.
//   skew:   the inverse placement (..., M, W) -> (..., M, W + M), zeros elsewhere.
#pragma once
#include <ATen/ATen.h>

namespace spanformer::ops {

at::Tensor unskew(const at::Tensor& x);
at::Tensor skew(const at::Tensor& x);

}  // namespace spanformer::ops
