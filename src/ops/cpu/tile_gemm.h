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
// K padded to even with a zero row of B and column of A, in per-thread buffers: by ATen's
// cpublas::pack on AMX, by our own packing for bfloat16 on AVX512-BF16 (oneDNN's brgemm runs its
// dot-product instructions there, but cpublas::could_pack only reports AMX; a one-time probe product
// checks that it does). Elsewhere (AVX2, AVX-512 without BF16, float16 without AMX-FP16) ATen's brgemm
// computes them in its portable fallback, slower than float32, so the kernels widen there
// (half_products below). Measured on one core of the AMD EPYC above (AVX512-BF16, no AMX), the
// brgemm alone on pre-packed operands: bfloat16 185-226 GFLOP/s at 64 x 103 x 32 .. 64 x 64 x 256,
// float32 94-114, the portable bfloat16 fallback 57-87.
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <string>

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

// How the kernels meet 16-bit inputs in their products:
//   widened  converted to float32 once and multiplied in float32 (every LibTorch, every CPU);
//   native   multiplied as 16-bit operands with float32 accumulation (the 16-bit tile_gemm above).
// `auto` (the default) is native where the CPU multiplies that dtype natively (AMX; AVX512-BF16 for
// bfloat16) and this LibTorch has 16-bit brgemm, widened elsewhere. SPANFORMER_CPU_HALF_PRODUCTS=auto|widened|native sets it for
// the process (read once); HalfProductsOverride sets it for a scope (the tests reach both everywhere).
// native is refused with a one-line error on a LibTorch without 16-bit brgemm.
enum class HalfProducts { automatic, widened, native };
bool half_products_native(c10::ScalarType dtype);  // for 16-bit dtypes; false for float32 and float64
bool half_products_available();                      // whether this LibTorch has 16-bit brgemm
bool half_products_in_hardware(c10::ScalarType dtype);  // pairs-of-rows products: AMX, or AVX512-BF16 for bfloat16

// Sets the process-wide mode (the override's, so it wins over the environment), by name: "auto",
// "widened" or "native"; anything else is a one-line error.
void set_half_products(const std::string& mode);

class HalfProductsOverride {
 public:
  explicit HalfProductsOverride(HalfProducts mode);
  ~HalfProductsOverride();
  HalfProductsOverride(const HalfProductsOverride&) = delete;
  HalfProductsOverride& operator=(const HalfProductsOverride&) = delete;

 private:
  int previous_;
};

// Ends this thread's use of the AMX tile registers after native 16-bit products (cpublas::brgemm_release;
// nothing elsewhere). The kernels call it at the end of each work item that used them.
void release_half_products(c10::ScalarType dtype);

}  // namespace spanformer::ops::cpu
