#include "cpu_features.h"

#include "spanformer/util/torch_compat.h"

namespace spanformer::ops::cpu {
namespace {

VectorLevel pick_level() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12  // the levels' names
  const std::string aten = compat::cpu_info().vector_isa;  // "AVX512", "AVX2", "DEFAULT" (ATEN_CPU_CAPABILITY applied)
  __builtin_cpu_init();
  if (aten.rfind("AVX512", 0) == 0 && __builtin_cpu_supports("x86-64-v4")) return VectorLevel::avx512;
  if ((aten.rfind("AVX512", 0) == 0 || aten == "AVX2") && __builtin_cpu_supports("x86-64-v3")) return VectorLevel::avx2;
#endif
  return VectorLevel::baseline;
}

}  // namespace

VectorLevel vector_level() {
  static const VectorLevel level = pick_level();
  return level;
}

const char* vector_level_name() {
  switch (vector_level()) {
    case VectorLevel::avx512: return "AVX512";
    case VectorLevel::avx2: return "AVX2";
    default: return "DEFAULT";
  }
}

}  // namespace spanformer::ops::cpu
