#include "tile_gemm.h"

#include <ATen/ATen.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include "spanformer/util/error.h"
#include "spanformer/util/switches.h"
#include "spanformer/util/torch_compat.h"

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

// B (K, N), row-major with ld_b, into the pairs-of-rows (VNNI) layout (Ke / 2, N, 2), Ke = K rounded up
// to even, a zero row after an odd K: element (k, n) goes to ((k / 2) N + n) 2 + k % 2. Two 16-bit
// values make one 32-bit word, the even row's in the low half (x86 is little-endian); the inner loop is
// what the compiler vectorises.
template <typename half_t>
void pack_pairs(int64_t K, int64_t N, const half_t* B, int64_t ld_b, half_t* out) {
  static_assert(sizeof(half_t) == 2);
  const auto* b = reinterpret_cast<const uint16_t*>(B);
  auto* o = reinterpret_cast<uint32_t*>(out);
  int64_t k = 0;
  for (; k + 1 < K; k += 2) {
    const uint16_t* r0 = b + k * ld_b;
    const uint16_t* r1 = r0 + ld_b;
    uint32_t* dst = o + (k / 2) * N;
    for (int64_t n = 0; n < N; ++n) dst[n] = uint32_t(r0[n]) | (uint32_t(r1[n]) << 16);
  }
  if (k < K) {
    const uint16_t* r0 = b + k * ld_b;
    uint32_t* dst = o + (k / 2) * N;
    for (int64_t n = 0; n < N; ++n) dst[n] = uint32_t(r0[n]);
  }
}

// C (M, N) (+)= A (M, K) B (K, N) with 16-bit operands. Where the CPU multiplies them natively, B goes
// into pairs of rows by pack_pairs (one packing for every CPU: ATen's cpublas::pack, which only AMX
// offers, accepts at most 64 columns there), K padded to even with a zero column of A (in this thread's
// buffer) and a zero row of B.
template <typename half_t>
void half_gemm(int64_t M, int64_t N, int64_t K, const half_t* A, int64_t ld_a, const half_t* B, int64_t ld_b, float* C,
               int64_t ld_c, bool accumulate) {
  constexpr auto dtype = c10::CppTypeToScalarType<half_t>::value;
  if (!half_products_in_hardware(dtype)) {
    at::native::cpublas::brgemm(M, N, K, ld_a, ld_b, ld_c, accumulate, A, B, C, /*is_vnni=*/false);
    return;
  }
  thread_local std::vector<half_t> a_even, b_packed;
  const int64_t Ke = K + K % 2;
  if (Ke != K) {
    a_even.assign(static_cast<size_t>(M * Ke), half_t(0.0f));  // (M, Ke)
    for (int64_t r = 0; r < M; ++r) std::memcpy(a_even.data() + r * Ke, A + r * ld_a, K * sizeof(half_t));
    A = a_even.data();
    ld_a = Ke;
  }
  b_packed.resize(static_cast<size_t>(Ke * N));  // (Ke / 2, N, 2)
  pack_pairs(K, N, B, ld_b, b_packed.data());
  at::native::cpublas::brgemm(M, N, Ke, ld_a, N, ld_c, accumulate, A, b_packed.data(), C, /*is_vnni=*/true);
}

// Whether ATen's brgemm multiplies 16-bit operands in the pairs-of-rows layout on this CPU (AMX;
// AVX512-BF16 for bfloat16; AVX512-FP16 or AMX-FP16 for float16), within the instruction set oneDNN is
// allowed (ONEDNN_MAX_CPU_ISA lowers it). Asked the same way on every CPU: one product of the shape
// class the kernels use (more than 64 columns, odd K), packed by pack_pairs; a CPU without such
// products throws or computes something else, and the answer is no.
template <typename half_t>
bool vnni_products_work() {
  const int64_t M = 5, N = 80, K = 7, Ke = 8;
  std::vector<half_t> a(M * Ke, half_t(0.0f)), b(K * N), packed(Ke * N);  // A (M, Ke), B (K, N)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t x = 0; x < K; ++x) a[i * Ke + x] = half_t(float((i * 3 + x) % 5) - 2.0f);
  for (int64_t i = 0; i < K * N; ++i) b[i] = half_t(float(i % 7) - 3.0f);
  pack_pairs(K, N, b.data(), N, packed.data());
  std::vector<float> c(M * N, 0.0f);
  try {
    at::native::cpublas::brgemm(M, N, Ke, Ke, N, N, false, a.data(), packed.data(), c.data(), /*is_vnni=*/true);
    at::native::cpublas::brgemm_release(/*is_vnni=*/true);
  } catch (const std::exception&) {
    return false;
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float want = 0;
      for (int64_t x = 0; x < K; ++x) want += float(a[i * Ke + x]) * float(b[x * N + j]);
      if (c[i * N + j] != want) return false;  // small integers: exact in any order
    }
  return true;
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
    const std::string v = switch_value("SPANFORMER_CPU_HALF_PRODUCTS");  // util/switches.h
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
  static const bool bf16 = vnni_products_work<c10::BFloat16>();
  static const bool f16 = vnni_products_work<c10::Half>();
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
