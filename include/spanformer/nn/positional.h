// Sinusoidal positional encodings (Vaswani et al. 2017, section 3.5), the one home of the formula for
// every family that adds absolute positions (GPT with positions = sinusoidal, the seq2seq Transformer):
//
//   P[p, 2i] = sin(p / 10000^(2i / H)),   P[p, 2i + 1] = cos(p / 10000^(2i / H))        (T, H)
//
// computed in double and returned as float32. (Transformer-XL's relative encodings use the same
// frequencies in another layout: models/xl.h, sinusoid().)
#pragma once
#include <ATen/ATen.h>

namespace spanformer::nn {

at::Tensor sinusoidal_positions(int64_t T, int64_t H);

}  // namespace spanformer::nn
