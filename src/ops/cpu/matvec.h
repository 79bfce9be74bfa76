// One row's product in decoding, y = x W^T + b, as a streaming matrix-vector product: a decoding step
// reads every weight once per token, and at::linear's one-row product (MKL's) read the weights at about
// half the bandwidth the CPU reads at (docs/benchmarks.md, "Greedy decoding"). For x one row (any leading
// shape of one element) on the CPU, W (out, in) float32 stored either (in, out) (lay_out_for_decoding's
// blocks) or (out, in) (the tied output layer), x and b float32, and no gradient asked for; elsewhere
// (bfloat16 among them: ATen's product is faster there) an undefined tensor: the caller runs at::linear.
#pragma once
#include <ATen/ATen.h>

namespace spanformer::ops::cpu {

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace spanformer::ops::cpu
