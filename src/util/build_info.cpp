#include "spanformer/util/build_info.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>

#include <fmt/format.h>

#include "spanformer/git_commit.h"
#include "spanformer/util/switches.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/version.h"
#include "ops/cpu_features.h"

namespace spanformer {
namespace {

std::string cuda_text() {
#ifdef SPANFORMER_WITH_CUDA
  const bool built = true;
#else
  const bool built = false;
#endif
  if (!built) return "not built in";
  return torch::cuda::is_available() ? fmt::format("{} device(s)", torch::cuda::device_count()) : "built in, no device";
}

}  // namespace

std::string cpu_text() {
  const auto cpu = compat::cpu_info();
  // How the attention kernels multiply 16-bit inputs (ops/cpu/tile_gemm.h) and the level of their float32
  // rows (ops/cpu/row_math.h), after the switches that lower them (ATEN_CPU_CAPABILITY,
  // ONEDNN_MAX_CPU_ISA, SPANFORMER_CPU_HALF_PRODUCTS).
  auto products = [](c10::ScalarType dtype) {
    return ops::cpu::half_products_native(dtype) ? "16-bit operands" : "widened to float32";
  };
  const char* onednn_cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  return fmt::format("{}, {}, bf16 hardware: {}, rows {}, bf16 products {}, fp16 products {}{}", cpu.name,
                     cpu.vector_isa, cpu.bf16_hardware(), ops::cpu::vector_level_name(), products(at::kBFloat16),
                     products(at::kHalf), onednn_cap ? fmt::format(", ONEDNN_MAX_CPU_ISA={}", onednn_cap) : "");
}

bool bf16_products_in_hardware() { return ops::cpu::half_products_in_hardware(at::kBFloat16); }

std::string bf16_speed_warning(const compat::CpuInfo& cpu, bool products_in_hardware) {
  if (products_in_hardware) return "";
  return fmt::format("spanformer: train.amp=bf16 where bf16 products have no hardware (AMX or AVX512-BF16; this CPU: {}, {}, "
                     "bf16 hardware: {}): it runs, but slower than float32", cpu.name, cpu.vector_isa, cpu.bf16_hardware());
}

void check_environment() { ops::cpu::half_products_native(at::kBFloat16); }

std::string version_line() {
  return fmt::format("spanformer {} (commit {}), LibTorch {}, CUDA: {}, CPU: {}\nswitches: {}", kVersion, kGitCommit,
                     compat::torch_version(), cuda_text(), cpu_text(), switches_text());
}

nlohmann::json build_record(const std::vector<std::string>& command) {
  nlohmann::json j{{"version", kVersion}, {"commit", kGitCommit}, {"torch", compat::torch_version()}, {"cuda", cuda_text()}, {"cpu", cpu_text()}};
  if (!command.empty()) {
    char host[256] = {0};
    if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
    j["host"] = host;
    j["start"] = utc_timestamp();
    j["command"] = command;
  }
  return j;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace spanformer
