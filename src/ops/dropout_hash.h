// The dropout decision of the adaptive-span attention op, shared by the CPU path, the reference and
// the CUDA kernels so that all three drop the same weights: a splitmix64 hash of
// (seed, batch, head, query, distance) turned into a uniform number in [0, 1). splitmix64 also keys
// the models' dropout (src/nn/dropout.cpp).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SPANFORMER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPANFORMER_HOST_DEVICE inline
#endif

namespace spanformer::ops {

// splitmix64's output function: nearby inputs give unrelated 64-bit outputs.
SPANFORMER_HOST_DEVICE uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

SPANFORMER_HOST_DEVICE bool dropout_keep_hash(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t d, double p) {
  const uint64_t x = splitmix64(seed ^ (static_cast<uint64_t>(b) * 0x9E3779B97F4A7C15ULL) ^
                                (static_cast<uint64_t>(h) << 48) ^ (static_cast<uint64_t>(i) << 24) ^
                                static_cast<uint64_t>(d));
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0) >= p;
}

}  // namespace spanformer::ops
