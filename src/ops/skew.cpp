#include "spanformer/ops/skew.h"

#include <vector>

namespace spanformer::ops {

at::Tensor unskew(const at::Tensor& x) {
  // x: (..., M, W + M) contiguous; row i of the result starts at column i.
  auto xc = x.contiguous();
  const int64_t M = xc.size(-2), W = xc.size(-1) - M;
  std::vector<int64_t> sizes(xc.sizes().begin(), xc.sizes().end());
  std::vector<int64_t> strides(xc.strides().begin(), xc.strides().end());
  sizes.back() = W;
  strides[strides.size() - 2] = W + M + 1;
  return xc.as_strided(sizes, strides);                                  // (..., M, W)
}

at::Tensor skew(const at::Tensor& x) {
  // x: (..., M, W) -> (..., M, W + M) with row i shifted right by i (the reference's pad/view trick).
  const int64_t M = x.size(-2), W = x.size(-1);
  auto lead = x.sizes().slice(0, x.dim() - 2).vec();
  auto padded = at::constant_pad_nd(x, {0, M + 1});                      // (..., M, W + M + 1)
  auto flat = padded.reshape({-1, M * (W + M + 1)}).narrow(1, 0, M * (W + M));
  lead.push_back(M);
  lead.push_back(W + M);
  return flat.reshape(lead);                                             // (..., M, W + M)
}

}  // namespace spanformer::ops
