// Matrix products into preallocated tiles, for the CPU kernels: C (M, N) = A (M, K) B (K, N), or
// C += A B, all row-major with leading dimensions (ld_a >= K, ld_b >= N, ld_c >= N), no allocation.
// Float32 goes to oneDNN's batch-reduce GEMM micro-kernel through ATen (at::native::cpublas::brgemm,
// LibTorch 2.x; it falls back to ATen's BLAS itself where the CPU has no micro-kernel); where LibTorch
// has no brgemm (Debian's 1.13), and for float64, to ATen's mm on views of the same memory.
// Measured on one core of an AMD EPYC (Zen 4, AVX-512), LibTorch 2.15, at the flash kernel's tile
// shapes (64 x 256 x 64, 64 x 64 x 256): brgemm 107-116 GFLOP/s, MKL's sgemm 93-96, at::mm 90.
#pragma once
#include <cstdint>

namespace spanformer::ops::cpu {

void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ld_a, const float* B, int64_t ld_b, float* C,
               int64_t ld_c, bool accumulate);
void tile_gemm(int64_t M, int64_t N, int64_t K, const double* A, int64_t ld_a, const double* B, int64_t ld_b,
               double* C, int64_t ld_c, bool accumulate);

// Which engine serves float32 tiles in this build: "oneDNN brgemm" or "ATen mm".
const char* tile_gemm_engine();

}  // namespace spanformer::ops::cpu
