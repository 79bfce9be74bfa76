// The randomness of every dropout in the library, below every op and model: a seed drawn from
// LibTorch's default CPU generator per call (so a seeded run repeats its masks, and a resumed one, whose
// checkpoint keeps the generator's state, goes on with the same ones), and splitmix64 to turn seeds and
// positions into unrelated 64-bit keys. Each dropout hashes (seed, position) itself, so a backward
// regenerates its forward's mask without storing it: the models' dropout (nn/dropout.h) and the
// attention ops' (ops/adaptive_span_attention.h, ops/flash_attention.h; src/ops/dropout_hash.h, which
// the CUDA kernels share).
#pragma once
#include <cstdint>

namespace spanformer::ops {

// A seed from LibTorch's default CPU generator.
uint64_t draw_dropout_seed();

// splitmix64's output function: nearby inputs give unrelated 64-bit outputs.
uint64_t mix_seed(uint64_t x);

}  // namespace spanformer::ops
