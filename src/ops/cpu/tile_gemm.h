// Matrix products into preallocated tiles, for the CPU kernels: C (M, N) = A (M, K) B (K, N), or
// C += A B, all row-major with leading dimensions (ld_a >= K, ld_b >= N, ld_c >= N), no allocation.
// Float32 goes to oneDNN's batch-reduce GEMM micro-kernel through ATen (at::native::cpublas::brgemm,
// LibTorch 2.x; it falls back to ATen's BLAS itself where the CPU has no micro-kernel); where LibTorch
// has no brgemm (Debian's 1.13), and for float64, to ATen's mm on views of the same memory.
// Measured on one core of an AMD EPYC (Zen 4, AVX-512), LibTorch 2.15, at the flash kernel's tile
// shapes (64 x 256 x 64, 64 x 64 x 256): brgemm 107-116 GFLOP/s, MKL's sgemm 93-96, at::mm 90.
//
// 16-bit operands (bfloat16 x bfloat16 or float16 x float16, float32 accumulation into C): where the
// CPU multiplies them natively, B is packed into the pairs-of-rows (VNNI) layout the micro-kernel reads,
// K padded to even with a zero row of B and column of A, in per-thread buffers, by our own packing on
// every CPU (ATen's cpublas::pack exists on AMX only and refuses more than 64 columns there). Whether
// the CPU multiplies them natively is asked once per dtype by a probe product (AMX; AVX512-BF16 for
// bfloat16; within oneDNN's ONEDNN_MAX_CPU_ISA, which the tests lower). Elsewhere (AVX2, AVX-512
// without BF16, float16 without AVX512-FP16 or AMX-FP16) ATen's brgemm computes them in its portable
// fallback, slower than float32, so the kernels widen there (half_products below). Measured on one core
// of the AMD EPYC above (AVX512-BF16, no AMX), the brgemm alone on pre-packed operands: bfloat16
// 185-226 GFLOP/s at 64 x 103 x 32 .. 64 x 64 x 256, float32 94-114, the portable bfloat16 fallback 57-87.
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <string>

#include "../cpu_features.h"

namespace spanformer::ops::cpu {

void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ld_a, const float* B, int64_t ld_b, float* C,
               int64_t ld_c, bool accumulate);
void tile_gemm(int64_t M, int64_t N, int64_t K, const double* A, int64_t ld_a, const double* B, int64_t ld_b,
               double* C, int64_t ld_c, bool accumulate);
void tile_gemm(int64_t M, int64_t N, int64_t K, const c10::BFloat16* A, int64_t ld_a, const c10::BFloat16* B,
               int64_t ld_b, float* C, int64_t ld_c, bool accumulate);
void tile_gemm(int64_t M, int64_t N, int64_t K, const c10::Half* A, int64_t ld_a, const c10::Half* B, int64_t ld_b,
               float* C, int64_t ld_c, bool accumulate);

// Which engine serves float32 tiles in this build: "oneDNN brgemm" or "ATen mm".
const char* tile_gemm_engine();

// The modes of the 16-bit products (automatic, widened, native) and what runs here: ops/cpu_features.h.

// Ends this thread's use of the AMX tile registers after native 16-bit products (cpublas::brgemm_release;
// nothing elsewhere). The kernels call it at the end of each work item that used them.
void release_half_products(c10::ScalarType dtype);

}  // namespace spanformer::ops::cpu
