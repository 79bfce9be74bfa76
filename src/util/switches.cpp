// The switches' one table and reader (util/switches.h).
#include "spanformer/util/switches.h"

#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/util/error.h"
#include "ops/cuda/variants.h"

namespace spanformer {
namespace {

template <typename Id, size_t N>
std::vector<std::string> variant_names(const ops::cuda::KernelVariant<Id> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& row : table) names.emplace_back(row.name);
  return names;
}

const Switch* find(const char* variable) {
  for (const auto& s : switches())
    if (std::string(s.variable) == variable) return &s;
  return nullptr;
}

}  // namespace

const std::vector<Switch>& switches() {
  static const std::vector<Switch> table = {
      {"SPANFORMER_CPU_HALF_PRODUCTS", {"auto", "widened", "native"},
       "how the CPU attention kernels multiply bf16 / fp16 inputs (ops/cpu/tile_gemm.h)"},
      {"SPANFORMER_STEP_KERNELS", {"auto", "kernels", "composition"},
       "the GPT step's add + LayerNorm and bias + GELU on CUDA: the fused kernels or the composition"},
      {"SPANFORMER_SPAN_KERNEL", variant_names(ops::cuda::kSpanVariants),
       "the adaptive-span op's CUDA kernel variant (ops/cuda/variants.h)"},
      {"SPANFORMER_FLASH_KERNEL", variant_names(ops::cuda::kFlashVariants),
       "the flash op's CUDA kernel variant (ops/cuda/variants.h)"},
  };
  return table;
}

std::string switch_value(const char* variable) {
  const Switch* s = find(variable);
  if (s == nullptr) fail("{} is not a switch (util/switches.h)", variable);
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return s->values.front();
  for (const auto& v : s->values)
    if (v == value) return v;
  fail("{}={} is not one of: {}", variable, value, fmt::join(s->values, ", "));
}

std::string switches_text() {
  std::vector<std::string> parts;
  for (const auto& s : switches()) {
    const char* value = std::getenv(s.variable);
    const std::string v = value == nullptr || *value == '\0' ? s.values.front() : value;
    const bool known = std::find(s.values.begin(), s.values.end(), v) != s.values.end();
    parts.push_back(fmt::format("{}={}{}", s.variable, v, known ? "" : " (not one of its values)"));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace spanformer
