#include "spanformer/util/usage.h"

#include <algorithm>

namespace spanformer {
namespace {

// Optimal string alignment distance (Damerau-Levenshtein without repeated edits of one substring).
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

}  // namespace

std::string did_you_mean(const std::string& word, const std::vector<std::string>& choices) {
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  const std::string* best = nullptr;
  size_t best_distance = limit + 1;
  for (const auto& c : choices) {
    const size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = &c;
    }
  }
  return best ? fmt::format(" (did you mean '{}'?)", *best) : "";
}

}  // namespace spanformer
