// The one place where differences between LibTorch versions live.
//
// spanformer builds against Debian's libtorch-dev 1.13 (CPU) and LibTorch 2.x (+CUDA). Everything that
// is spelled differently across those versions goes through a helper here, so the rest of the code
// base is version-agnostic.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <string>

// c10d's Gloo backend: Debian's LibTorch ships gloo's headers; PyTorch's wheels (LibTorch 2.x on the GPU
// machine) define USE_C10D_GLOO but ship no gloo headers, so ProcessGroupGloo cannot be compiled there.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define SPANFORMER_HAS_C10D_GLOO 1
#else
#define SPANFORMER_HAS_C10D_GLOO 0
#endif

namespace spanformer::compat {

constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;

inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// The message of a c10::Error without LibTorch's C++ stack trace (users get one line).
inline std::string error_message(const c10::Error& e) { return e.what_without_backtrace(); }

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

}  // namespace spanformer::compat
