// Fuzz targets for the readers of user files: each target takes arbitrary bytes as the file a
// user would give, opens it the way the tool does (and, where the reader allows, builds the model and
// runs it), and must either succeed or refuse with spanformer's one-line Error. Anything else is a
// finding: a sanitizer report (ASan, UBSan), a crash, a hang, or another exception escaping (a LibTorch
// c10::Error, std::bad_alloc from a size taken on trust, ...), which `expect_refusal` turns into abort().
//
// Two builds of the same sources:
//   libFuzzer   clang, -fsanitize=fuzzer,address,undefined (scripts/fuzz.sh, build-fuzz/): one binary per
//               target, SPANFORMER_FUZZ_TARGET(name) becomes LLVMFuzzerTestOneInput
//   replay      any compiler (the normal build, CTest's fuzz.replay): one binary, fuzz_replay TARGET
//               FILE|DIR..., that runs kept inputs (the seeds scripts/fuzz.sh makes, every kept crash)
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>

#include "spanformer/util/error.h"

namespace spanformer::fuzz {

// The bytes as a file the readers can open (one path per process, rewritten for every input).
std::string as_file(const uint8_t* data, size_t size, const std::string& suffix = "");
// A scratch directory of this process (created once, emptied by the caller where needed).
const std::string& scratch_dir();

// Prints "fuzz finding: <what>" and aborts (libFuzzer then keeps the input as a crash).
[[noreturn]] void fuzz_finding(const char* what);

// Inputs refused so far in this process (the replay prints it: seeds should mostly be accepted).
inline int& refusals() {
  static int count = 0;
  return count;
}

// The last input's outcome: empty when it was accepted, else the one-line message it was refused with
// (the replay holds each kept crash input to its expected outcome, tests/fuzz/crashes/*/NAME.expect).
inline std::string& last_refusal() {
  static std::string message;
  return message;
}

// Runs `body`; spanformer's Error is the expected refusal, anything else aborts with its message.
template <typename F>
int expect_refusal(F&& body) {
  last_refusal().clear();
  try {
    body();
  } catch (const spanformer::Error& e) {
    ++refusals();
    last_refusal() = e.what();
    if (last_refusal().empty()) last_refusal() = "(an empty message)";
  } catch (const std::exception& e) {
    fuzz_finding(e.what());
  }
  return 0;
}

using Target = int (*)(const uint8_t*, size_t);
int register_target(const char* name, Target target);

}  // namespace spanformer::fuzz

#ifdef SPANFORMER_LIBFUZZER
#define SPANFORMER_FUZZ_TARGET(name) extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#else
#define SPANFORMER_FUZZ_TARGET(name)                                                              \
  static int fuzz_target_##name(const uint8_t* data, size_t size);                               \
  [[maybe_unused]] static const int fuzz_registered_##name =                                     \
      spanformer::fuzz::register_target(#name, fuzz_target_##name);                              \
  static int fuzz_target_##name(const uint8_t* data, size_t size)
#endif
