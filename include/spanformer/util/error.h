// User-facing errors.
//
// Everything a user can get wrong (files, configs, checkpoints, command-line values) is reported by
// throwing spanformer::Error with a one-line message that names the problem. The CLI catches it,
// prints "spanformer: error: <message>" and exits non-zero: never a stack trace.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace spanformer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Turns any exception (ours, LibTorch's, the standard library's) into one line of text.
std::string one_line_message(const std::exception& e);

}  // namespace spanformer
