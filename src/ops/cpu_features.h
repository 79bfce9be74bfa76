// What the CPU kernels run on, below every op: the vector level of their loops and how they multiply
// 16-bit inputs. Each is decided once a process, from the CPU and the switches that lower it, so that
// a machine with more features runs every path below its own in the tests (the isa.* CTest entries):
//   vector level   AVX512 (x86-64-v4), AVX2 (x86-64-v3) or DEFAULT: the widest the CPU runs, at most
//                  ATen's ATEN_CPU_CAPABILITY (avx2, default), which ATen's own kernels follow too;
//   16-bit products  in hardware where a probe product in the pairs-of-rows layout runs and is exact
//                  (ops/cpu/tile_gemm.cpp): AMX, or AVX512-BF16 for bfloat16, within oneDNN's
//                  ONEDNN_MAX_CPU_ISA.
// `spanformer --version` and every test log print both (util/build_info.h, cpu_text).
#pragma once
#include <c10/core/ScalarType.h>

#include <string>

namespace spanformer::ops::cpu {

enum class VectorLevel { baseline = 0, avx2 = 1, avx512 = 2 };
VectorLevel vector_level();
const char* vector_level_name();  // "AVX512", "AVX2" or "DEFAULT"

// How the kernels meet 16-bit inputs in their products:
//   widened  converted to float32 once and multiplied in float32 (every LibTorch, every CPU);
//   native   multiplied as 16-bit operands with float32 accumulation (ops/cpu/tile_gemm.h).
// `auto` (the default) is native where the products run in hardware (above) and this LibTorch has 16-bit
// brgemm, widened elsewhere. SPANFORMER_CPU_HALF_PRODUCTS=auto|widened|native sets it for the process
// (read once); HalfProductsOverride sets it for a scope (the tests reach both everywhere). native is
// refused with a one-line error on a LibTorch without 16-bit brgemm.
enum class HalfProducts { automatic, widened, native };
bool half_products_native(c10::ScalarType dtype);       // for 16-bit dtypes; false for float32 and float64
bool half_products_available();                         // whether this LibTorch has 16-bit brgemm
bool half_products_in_hardware(c10::ScalarType dtype);  // the probe above

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

}  // namespace spanformer::ops::cpu
