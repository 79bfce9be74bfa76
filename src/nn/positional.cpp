#include "spanformer/nn/positional.h"

namespace spanformer::nn {

at::Tensor sinusoidal_positions(int64_t T, int64_t H) {
  auto p = at::arange(T, at::kDouble).unsqueeze(1);                                // (T, 1)
  auto i = at::arange(0, H, 2, at::kDouble);                                       // (ceil(H / 2))
  auto angle = p / at::pow(10000.0, i / static_cast<double>(H)).unsqueeze(0);      // (T, ceil(H / 2))
  auto table = at::zeros({T, H}, at::kDouble);
  table.slice(1, 0, H, 2).copy_(at::sin(angle));
  table.slice(1, 1, H, 2).copy_(at::cos(angle).narrow(1, 0, H / 2));
  return table.to(at::kFloat);                                                     // (T, H)
}

}  // namespace spanformer::nn
