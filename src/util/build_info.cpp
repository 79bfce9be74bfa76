#include "spanformer/util/build_info.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <ctime>

#include <fmt/format.h>

#include "spanformer/git_commit.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/version.h"
#include "ops/cpu/tile_gemm.h"

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
  // The attention kernels' bf16 products: native where the CPU has AMX or AVX512-BF16
  // (ops/cpu/tile_gemm.h).
  const bool native = ops::cpu::half_products_native(at::kBFloat16);
  return fmt::format("{}, {}, bf16 products: {} (attention kernels: {})", cpu.name, cpu.vector_isa,
                     cpu.bf16_hardware(), native ? "bf16 operands" : "widened to float32");
}

std::string bf16_speed_warning(const compat::CpuInfo& cpu) {
  if (cpu.bf16_hardware() != "none") return "";
  return fmt::format("spanformer: train.amp=bf16 on a CPU without bf16 hardware (AMX or AVX512-BF16; this one: {}, {}): "
                     "it runs, but slower than float32", cpu.name, cpu.vector_isa);
}

void check_environment() { ops::cpu::half_products_native(at::kBFloat16); }

std::string version_line() {
  return fmt::format("spanformer {} (commit {}), LibTorch {}, CUDA: {}, CPU: {}", kVersion, kGitCommit,
                     compat::torch_version(), cuda_text(), cpu_text());
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
