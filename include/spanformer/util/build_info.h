// What this binary is: for `spanformer --version` and for the record each training session leaves in
// its run directory (so a figure can always be traced to the code, library and machine that made it).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace spanformer {
namespace compat {
struct CpuInfo;
}

// "spanformer 0.1.0 (commit 3f2a9c1d0e4b), LibTorch 2.15.0, CUDA: not built in, CPU: AMD EPYC, AVX512,
// bf16 hardware: AVX512-BF16, rows AVX512, bf16 products 16-bit operands, fp16 products widened to float32"
std::string version_line();

// The CPU part of that line: name, the vector ISA ATen's kernels use, the bf16 hardware (AMX,
// AVX512-BF16 or none), the level of the attention kernels' float32 rows, how they multiply bf16 and
// fp16 inputs (16-bit operands, or widened to float32), and ONEDNN_MAX_CPU_ISA where it is set.
std::string cpu_text();

// What `train` and `bench` say once a process when train.amp=bf16 runs where the kernels' bf16 products
// have no hardware (neither AMX nor AVX512-BF16, or oneDNN kept from them: bf16 then runs, widened to
// float32, slower than float32 itself); "" where they have it.
std::string bf16_speed_warning(const compat::CpuInfo& cpu, bool products_in_hardware);

// Whether the attention kernels' bf16 products run in hardware here (a probe product, ops/cpu/tile_gemm.h).
bool bf16_products_in_hardware();

// Throws, with a one-line message, where an environment setting the library reads is malformed
// (SPANFORMER_CPU_HALF_PRODUCTS: auto, widened or native). The command line calls it first.
void check_environment();

// {"version", "commit", "torch", "cuda", "cpu"} as above, plus "host", "start" (UTC, ISO 8601) and "command"
// (the argument vector) when given.
nlohmann::json build_record(const std::vector<std::string>& command = {});

// The current time, UTC, ISO 8601 to the second: "2026-11-23T18:57:19Z".
std::string utc_timestamp();

}  // namespace spanformer
