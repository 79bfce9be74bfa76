#include "tile_gemm.h"

#include <ATen/ATen.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include "spanformer/util/error.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
constexpr bool kHalfBrgemm = true;

// C (M, N) (+)= A (M, K) B (K, N) with 16-bit operands. With AMX: B packed into pairs of rows, K padded
// to even (a zero row of B, a zero column of A), both in this thread's buffers.
template <typename half_t>
void half_gemm(int64_t M, int64_t N, int64_t K, const half_t* A, int64_t ld_a, const half_t* B, int64_t ld_b, float* C,
               int64_t ld_c, bool accumulate) {
  constexpr auto dtype = c10::CppTypeToScalarType<half_t>::value;
  if (!half_products_in_hardware(dtype)) {
    at::native::cpublas::brgemm(M, N, K, ld_a, ld_b, ld_c, accumulate, A, B, C, /*is_vnni=*/false);
    return;
  }
  thread_local std::vector<half_t> a_even, b_even, b_packed;
  const int64_t Ke = K + K % 2;
  if (Ke != K) {
    a_even.assign(static_cast<size_t>(M * Ke), half_t(0.0f));  // (M, Ke)
    for (int64_t r = 0; r < M; ++r) std::memcpy(a_even.data() + r * Ke, A + r * ld_a, K * sizeof(half_t));
    b_even.assign(static_cast<size_t>(Ke * N), half_t(0.0f));  // (Ke, N)
    for (int64_t r = 0; r < K; ++r) std::memcpy(b_even.data() + r * N, B + r * ld_b, N * sizeof(half_t));
    A = a_even.data();
    ld_a = Ke;
    B = b_even.data();
    ld_b = N;
  }
  b_packed.resize(static_cast<size_t>(Ke * N));  // (Ke / 2, N, 2)
  at::native::cpublas::pack(Ke, N, ld_b, N, dtype, dtype, B, b_packed.data());
  at::native::cpublas::brgemm(M, N, Ke, ld_a, N, ld_c, accumulate, A, b_packed.data(), C, /*is_vnni=*/true);
}
#else
constexpr bool kHalfBrgemm = false;

template <typename half_t>
void half_gemm(int64_t, int64_t, int64_t, const half_t*, int64_t, const half_t*, int64_t, float*, int64_t, bool) {
  TORCH_CHECK(false, "16-bit tile products need a LibTorch with 16-bit brgemm (2.x)");
}
#endif

// -1: not read yet; otherwise a HalfProducts value. The override, when set, wins.
std::atomic<int> g_env_mode{-1};
std::atomic<int> g_override{-1};

HalfProducts mode_from_env() {
  int m = g_env_mode.load();
  if (m < 0) {
    const char* s = std::getenv("SPANFORMER_CPU_HALF_PRODUCTS");
    const std::string v = s ? s : "auto";
    if (v != "auto" && v != "widened" && v != "native")
      fail("SPANFORMER_CPU_HALF_PRODUCTS is '{}': expected auto, widened or native", v);
    m = static_cast<int>(v == "native" ? HalfProducts::native : v == "widened" ? HalfProducts::widened
                                                                                  : HalfProducts::automatic);
    g_env_mode.store(m);
  }
  return static_cast<HalfProducts>(m);
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

void tile_gemm(int64_t M, int64_t N, int64_t K, const c10::BFloat16* A, int64_t ld_a, const c10::BFloat16* B,
               int64_t ld_b, float* C, int64_t ld_c, bool accumulate) {
  half_gemm(M, N, K, A, ld_a, B, ld_b, C, ld_c, accumulate);
}

void tile_gemm(int64_t M, int64_t N, int64_t K, const c10::Half* A, int64_t ld_a, const c10::Half* B, int64_t ld_b,
               float* C, int64_t ld_c, bool accumulate) {
  half_gemm(M, N, K, A, ld_a, B, ld_b, C, ld_c, accumulate);
}

const char* tile_gemm_engine() {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  return "oneDNN brgemm";
#else
  return "ATen mm";
#endif
}

bool half_products_available() { return kHalfBrgemm; }

bool half_products_in_hardware(c10::ScalarType dtype) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
  static const bool bf16 = at::native::cpublas::could_pack(at::kBFloat16);
  static const bool f16 = at::native::cpublas::could_pack(at::kHalf);
  return dtype == at::kBFloat16 ? bf16 : dtype == at::kHalf ? f16 : false;
#else
  return false;
#endif
}

bool half_products_native(c10::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const int o = g_override.load();
  const HalfProducts mode = o >= 0 ? static_cast<HalfProducts>(o) : mode_from_env();
  if (mode == HalfProducts::widened) return false;
  if (mode == HalfProducts::native) {
    if (!kHalfBrgemm) fail("16-bit products asked for (native) but this LibTorch has no 16-bit brgemm");
    return true;
  }
  return kHalfBrgemm && half_products_in_hardware(dtype);
}

void set_half_products(const std::string& mode) {
  if (mode != "auto" && mode != "widened" && mode != "native")
    fail("16-bit products '{}': expected auto, widened or native", mode);
  if (mode == "native" && !kHalfBrgemm) fail("16-bit products asked for (native) but this LibTorch has no 16-bit brgemm");
  g_override.store(static_cast<int>(mode == "native" ? HalfProducts::native : mode == "widened" ? HalfProducts::widened
                                                                                             : HalfProducts::automatic));
}

HalfProductsOverride::HalfProductsOverride(HalfProducts mode) : previous_(g_override.exchange(static_cast<int>(mode))) {}
HalfProductsOverride::~HalfProductsOverride() { g_override.store(previous_); }

void release_half_products(c10::ScalarType dtype) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
  if (half_products_in_hardware(dtype)) at::native::cpublas::brgemm_release(/*is_vnni=*/true);
#endif
}

}  // namespace spanformer::ops::cpu
