// Usage errors and suggestions: what the command line asked for does not exist (a mistyped command or
// config key). The CLI prints a usage error like every error, on one line, and exits with status 2
// (as for a malformed flag), so scripts can tell a wrong command line from a failed run.
#pragma once
#include <string>
#include <vector>

#include "spanformer/util/error.h"

namespace spanformer {

class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};

template <typename... Args>
[[noreturn]] void fail_usage(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

// " (did you mean 'x'?)" for the choice closest to `word` by edit distance (insertions, deletions,
// substitutions, and swaps of neighbours, each 1) when it is at most max(1, |word| / 3); "" otherwise.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& choices);

}  // namespace spanformer
