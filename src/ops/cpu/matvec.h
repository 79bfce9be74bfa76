// A decoding step's product, y = x W^T + b, streaming W once for up to kDecodeRows rows of x (a batch's
// step): a decoding step reads every weight once, and at::linear's one-row product read the weights at
// about half the bandwidth the CPU reads at in float32 (MKL's) and below it in bfloat16; for 8 rows MKL
// spent half its time packing W (docs/benchmarks.md, "Greedy decoding"). For x of at most kDecodeRows
// rows (any leading shape) on the CPU and no gradient asked for:
// float32 W (out, in) stored either (in, out) (lay_out_for_decoding's blocks) or (out, in) (the tied
// output layer), or bfloat16 W stored (out, in); x and b of W's dtype. Elsewhere an undefined tensor:
// the caller runs at::linear.
#pragma once
#include <ATen/ATen.h>

namespace spanformer::ops::cpu {

constexpr int64_t kDecodeRows = 16;  // the most rows of x taken (a batch's decoding step); more: at::linear
at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// How bfloat16 weights are multiplied now (matvec.cpp): true for AVX512-BF16's pairs, false widened to
// float32 (the switch SPANFORMER_CPU_HALF_PRODUCTS and the CPU decide).
bool decode_bf16_pairs();

}  // namespace spanformer::ops::cpu
