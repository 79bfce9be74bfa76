#include "spanformer/util/build_info.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <ctime>

#include <fmt/format.h>

#include "spanformer/git_commit.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/version.h"

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
  return fmt::format("{}, {}, bf16 products: {}", cpu.name, cpu.vector_isa, cpu.bf16_hardware());
}

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
