#include "tile_gemm.h"

#include <ATen/ATen.h>
#include <ATen/native/CPUBlas.h>

namespace spanformer::ops::cpu {
namespace {

// ATen's mm on views of the caller's memory: the fallback, and float64.
template <typename scalar_t>
void mm_on_views(int64_t M, int64_t N, int64_t K, const scalar_t* A, int64_t ld_a, const scalar_t* B, int64_t ld_b,
                 scalar_t* C, int64_t ld_c, bool accumulate) {
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value);
  const auto a = at::from_blob(const_cast<scalar_t*>(A), {M, K}, {ld_a, 1}, opts);  // (M, K)
  const auto b = at::from_blob(const_cast<scalar_t*>(B), {K, N}, {ld_b, 1}, opts);  // (K, N)
  auto c = at::from_blob(C, {M, N}, {ld_c, 1}, opts);                                // (M, N)
  if (accumulate)
    c.addmm_(a, b);
  else
    at::mm_out(c, a, b);
}

}  // namespace

void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ld_a, const float* B, int64_t ld_b, float* C,
               int64_t ld_c, bool accumulate) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  at::native::cpublas::brgemm(M, N, K, ld_a, ld_b, ld_c, accumulate, A, B, C, /*is_vnni=*/false);
#else
  mm_on_views(M, N, K, A, ld_a, B, ld_b, C, ld_c, accumulate);
#endif
}

void tile_gemm(int64_t M, int64_t N, int64_t K, const double* A, int64_t ld_a, const double* B, int64_t ld_b,
               double* C, int64_t ld_c, bool accumulate) {
  mm_on_views(M, N, K, A, ld_a, B, ld_b, C, ld_c, accumulate);
}

const char* tile_gemm_engine() {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  return "oneDNN brgemm";
#else
  return "ATen mm";
#endif
}

}  // namespace spanformer::ops::cpu
