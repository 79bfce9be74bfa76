// What the CPU kernels should run at on this machine, worked out apart from the library: from the CPU's
// own flags (GCC's __builtin_cpu_supports, /proc/cpuinfo) and the switches that lower a level
// (ATEN_CPU_CAPABILITY for the float32 rows, ONEDNN_MAX_CPU_ISA for the 16-bit products). The isa.* CTest
// entries run the kernels' tests with those switches set, so one machine checks every level below its own.
#pragma once
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

namespace spanformer::tu {

inline std::string environment(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

inline std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// "AVX512", "AVX2" or "DEFAULT": the CPU's widest micro-architecture level (x86-64-v4, -v3), at most
// ATEN_CPU_CAPABILITY where it is set.
inline std::string expected_row_level() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  __builtin_cpu_init();
  int level = __builtin_cpu_supports("x86-64-v4") ? 2 : __builtin_cpu_supports("x86-64-v3") ? 1 : 0;
  const auto cap = upper(environment("ATEN_CPU_CAPABILITY"));
  if (cap == "AVX2") level = std::min(level, 1);
  if (cap == "DEFAULT") level = 0;
  return level == 2 ? "AVX512" : level == 1 ? "AVX2" : "DEFAULT";
#else
  return "DEFAULT";
#endif
}

inline bool cpu_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

// Whether the 16-bit tile products must run on bf16 hardware here: the CPU has AMX-BF16 or AVX512-BF16
// and ONEDNN_MAX_CPU_ISA (unset, or a level with bf16) lets oneDNN use it. Empty where the level named
// is one this list does not know (then the test only checks values).
inline std::optional<bool> expected_bf16_products_in_hardware() {
  const bool hardware = cpu_flag("amx_bf16") || cpu_flag("avx512_bf16");
  const auto cap = upper(environment("ONEDNN_MAX_CPU_ISA"));
  if (cap.empty() || cap == "ALL" || cap == "DEFAULT") return hardware;
  for (const char* with : {"AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10_"})
    if (cap.rfind(with, 0) == 0) return hardware;
  for (const char* without : {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"})
    if (cap == without) return false;
  return std::nullopt;
}

}  // namespace spanformer::tu
