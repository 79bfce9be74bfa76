// The one place where differences between LibTorch versions live.
//
// spanformer builds against Debian's libtorch-dev 1.13 (CPU) and LibTorch 2.x (+CUDA). Everything that
// is spelled differently across those versions goes through a helper here, so the rest of the code
// base is version-agnostic.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

// The CPU's name and bf16 hardware from ATen (at::cpu::get_cpu_capabilities, cpuinfo underneath):
// LibTorch 2.15 has it; older ones read the kernel's /proc/cpuinfo instead.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#include <ATen/Version.h>
#include <ATen/cpu/Utils.h>
#define SPANFORMER_HAS_ATEN_CPU_CAPABILITIES 1
#else
#define SPANFORMER_HAS_ATEN_CPU_CAPABILITIES 0
#endif

// c10d's Gloo backend: Debian's LibTorch ships gloo's headers; PyTorch's wheels (LibTorch 2.x on the GPU
// machine) define USE_C10D_GLOO but ship no gloo headers, so ProcessGroupGloo cannot be compiled there.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define SPANFORMER_HAS_C10D_GLOO 1
#else
#define SPANFORMER_HAS_C10D_GLOO 0
#endif
// c10d's NCCL backend: a CUDA build (SPANFORMER_WITH_CUDA) of a LibTorch with NCCL (USE_C10D_NCCL, from
// torch_cuda's CMake target), with nccl.h found by CMake (SPANFORMER_WITH_NCCL).
#if defined(SPANFORMER_WITH_CUDA) && defined(SPANFORMER_WITH_NCCL) && defined(USE_C10D_NCCL)
#define SPANFORMER_HAS_C10D_NCCL 1
#else
#define SPANFORMER_HAS_C10D_NCCL 0
#endif

// Matrix products in float16 on the CPU: LibTorch 2.1 and later (1.13 has no Half addmm on the CPU). The
// kernels' float16 tests measure them against the float16 composition computed there.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define SPANFORMER_HAS_CPU_HALF_MATMUL 1
#else
#define SPANFORMER_HAS_CPU_HALF_MATMUL 0
#endif

// ATen's fused optimizer kernels on the CPU (_fused_adagrad_, _fused_adam_, _fused_adamw_): LibTorch 2.4 and
// later. Without them the optimizers run their plain composition of ATen operations.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define SPANFORMER_HAS_FUSED_OPTIMIZERS 1
#else
#define SPANFORMER_HAS_FUSED_OPTIMIZERS 0
#endif

// The base class of a c10d backend's collectives (ProcessGroupGloo, ProcessGroupNCCL): ProcessGroup in
// LibTorch 1.x, Backend from 2.0 on. Declared only; src/dist/impl.h includes the definitions.
namespace c10d {
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace spanformer::compat {

#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;

// The CPU as the kernels see it: its name, the widest vector ISA ATen's kernels use ("AVX512", "AVX2",
// "DEFAULT"), and whether bf16 products have hardware (AMX tiles, AVX512-BF16 dot products).
struct CpuInfo {
  std::string name, vector_isa;
  bool amx_bf16 = false, avx512_bf16 = false;
  // "AMX", "AVX512-BF16" or "none": what a bf16 product runs on.
  std::string bf16_hardware() const { return amx_bf16 ? "AMX" : avx512_bf16 ? "AVX512-BF16" : "none"; }
};

inline CpuInfo cpu_info() {
  CpuInfo info;
#if SPANFORMER_HAS_ATEN_CPU_CAPABILITIES
  const auto caps = at::cpu::get_cpu_capabilities();
  auto flag = [&](const char* key) {
    const auto it = caps.find(key);
    return it != caps.end() && it->second.isBool() && it->second.toBool();
  };
  if (const auto it = caps.find("cpu_name"); it != caps.end() && it->second.isString()) info.name = it->second.toStringRef();
  info.amx_bf16 = flag("amx_bf16");
  info.avx512_bf16 = flag("avx512_bf16");
  info.vector_isa = at::get_cpu_capability();
#else
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const auto value = line.substr(std::min(line.size(), colon + 2));
    if (key == "model name" && info.name.empty()) info.name = value;
    if (key == "flags" && flags.empty()) flags = " " + value + " ";
  }
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  info.amx_bf16 = has("amx_bf16");
  info.avx512_bf16 = has("avx512_bf16");
  info.vector_isa = has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq") ? "AVX512"
                    : has("avx2") && has("fma")                                          ? "AVX2"
                                                                                         : "DEFAULT";
  // ATen's own switch lowers it, as ATen's kernels read it.
  if (const char* cap = std::getenv("ATEN_CPU_CAPABILITY")) {
    std::string c = cap;
    for (auto& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (c == "default") info.vector_isa = "DEFAULT";
    if (c == "avx2" && info.vector_isa == "AVX512") info.vector_isa = "AVX2";
  }
#endif
  if (info.name.empty()) info.name = "unknown CPU";
  return info;
}

inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// The message of a c10::Error without LibTorch's C++ stack trace (users get one line).
inline std::string error_message(const c10::Error& e) { return e.what_without_backtrace(); }

// clamp(x, lo, hi) whose gradient is 1 on the closed interval [lo, hi], as LibTorch 1.x's clamp has it.
// LibTorch 2.x passes no gradient where x equals lo or hi. The adaptive-span mask sits exactly on both
// ends whenever a span z is a whole number of tokens (z = 0 at init and after every clamp of the
// parameter), and the reference was trained with the 1.x rule, so every build keeps that rule: the
// value is clamp's own (bit for bit), the gradient comes from the (x - x.detach()) term only.
inline at::Tensor clamp_closed_gradient(const at::Tensor& x, double lo, double hi) {
  auto value = x.clamp(lo, hi).detach();
  if (!x.requires_grad()) return value;
  auto inside = ((x >= lo) & (x <= hi)).to(x.scalar_type());
  return value + (x - x.detach()) * inside;
}

// State of the default generator of a device type, as a CPU byte tensor (saved in checkpoints so
// that dropout masks continue exactly after a resume).
inline at::Tensor generator_state(c10::DeviceType type) {
  at::Generator gen = type == c10::DeviceType::CPU ? at::detail::getDefaultCPUGenerator()
                                                   : at::globalContext().defaultGenerator(c10::Device(type));
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_generator_state(c10::DeviceType type, const at::Tensor& state) {
  at::Generator gen = type == c10::DeviceType::CPU ? at::detail::getDefaultCPUGenerator()
                                                   : at::globalContext().defaultGenerator(c10::Device(type));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The dtype autocast casts to on this device type when a region is active there; nullopt otherwise.
inline std::optional<at::ScalarType> autocast_dtype(c10::DeviceType type) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // Only the device types autocast has a state for: asking about any other (meta tensors, shape
  // inference) is an error in ATen, and such tensors are never in a region.
  if (type != c10::DeviceType::CPU && type != c10::DeviceType::CUDA) return std::nullopt;
  if (!at::autocast::is_autocast_enabled(type)) return std::nullopt;
  return at::autocast::get_autocast_dtype(type);
#else
  if (type == c10::DeviceType::CPU)
    return at::autocast::is_cpu_enabled() ? std::optional<at::ScalarType>(at::autocast::get_autocast_cpu_dtype()) : std::nullopt;
  if (type == c10::DeviceType::CUDA)
    return at::autocast::is_enabled() ? std::optional<at::ScalarType>(at::autocast::get_autocast_gpu_dtype()) : std::nullopt;
  return std::nullopt;
#endif
}

// Autocast of one device type (CPU or CUDA) to `dtype` while the guard lives, as Python's
// torch.autocast(device_type, dtype) does; the previous state comes back at the end and the cast cache is
// cleared when the outermost guard ends. LibTorch 2.4 made the state per device type.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType type, at::ScalarType dtype) : type_(type) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    enabled_ = at::autocast::is_autocast_enabled(type);
    dtype_ = at::autocast::get_autocast_dtype(type);
    at::autocast::set_autocast_enabled(type, true);
    at::autocast::set_autocast_dtype(type, dtype);
#else
    TORCH_CHECK(type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA, "autocast: CPU or CUDA only");
    const bool cpu = type == c10::DeviceType::CPU;
    enabled_ = cpu ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
    dtype_ = cpu ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
    cpu ? at::autocast::set_cpu_enabled(true) : at::autocast::set_enabled(true);
    cpu ? at::autocast::set_autocast_cpu_dtype(dtype) : at::autocast::set_autocast_gpu_dtype(dtype);
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(type_, enabled_);
    at::autocast::set_autocast_dtype(type_, dtype_);
#else
    const bool cpu = type_ == c10::DeviceType::CPU;
    cpu ? at::autocast::set_cpu_enabled(enabled_) : at::autocast::set_enabled(enabled_);
    cpu ? at::autocast::set_autocast_cpu_dtype(dtype_) : at::autocast::set_autocast_gpu_dtype(dtype_);
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType type_;
  bool enabled_ = false;
  at::ScalarType dtype_ = at::kFloat;
};

// PyTorch's fused attention (LibTorch 2.0+: at::scaled_dot_product_attention, the CPU flash kernel or
// the CUDA ones), causal with query i reading keys 0 .. i, no dropout: q (B, K, N, D), k, v (B, K, N, D).
// Undefined where LibTorch has none (1.13): the caller then takes its own path.
inline at::Tensor sdpa_causal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  (void)q, (void)k, (void)v;
  return {};
#endif
}

}  // namespace spanformer::compat
