#include "spanformer/models/par.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "spanformer/util/error.h"

namespace spanformer::models::par {
namespace {

void check(const BlockProbs& probs) {
  if (probs.empty()) fail("derive: no blocks");
  for (size_t b = 0; b < probs.size(); ++b) {
    double s = 0;
    for (double p : probs[b]) {
      if (!(p >= 0 && p <= 1)) fail("derive: block {} has a probability {} outside [0, 1]", b, p);
      s += p;
    }
    if (std::abs(s - 1) > 1e-4) fail("derive: block {} probabilities sum to {}, not 1", b, s);
  }
}

int argmax3(const std::array<double, 3>& p) {
  return static_cast<int>(std::max_element(p.begin(), p.end()) - p.begin());  // first maximum on ties
}

}  // namespace

std::string derive_argmax(const BlockProbs& probs) {
  check(probs);
  std::string out;
  for (const auto& p : probs) {
    const int k = argmax3(p);
    if (k == 0) out += 'a';
    if (k == 1) out += 'f';
  }
  if (out.empty()) fail("derive: every block chose identity; nothing is left of the network");
  return out;
}

std::string derive_par(const BlockProbs& probs, double ratio) {
  check(probs);
  if (!(ratio >= 1)) fail("derive: the total:attention ratio must be >= 1 (got {})", ratio);
  const auto N = static_cast<int64_t>(probs.size());
  const int64_t lower = (2 * N + 2) / 3;  // ceil(2N / 3)
  std::vector<int64_t> kept, candidates;
  for (int64_t b = 0; b < N; ++b) {
    if (argmax3(probs[b]) == 2) continue;
    kept.push_back(b);
    if (b < lower) candidates.push_back(b);
  }
  if (kept.empty()) fail("derive: every block chose identity; nothing is left of the network");
  if (candidates.empty()) fail("derive: no block is kept in the lower two thirds of the network for attention");
  const int64_t T = static_cast<int64_t>(kept.size());
  const int64_t n_attn = std::clamp<int64_t>(std::llround(static_cast<double>(T) / ratio), 1,
                                             static_cast<int64_t>(candidates.size()));
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int64_t a, int64_t b) { return probs[a][0] > probs[b][0]; });
  std::vector<bool> is_attn(N, false);
  for (int64_t i = 0; i < n_attn; ++i) is_attn[candidates[i]] = true;
  std::string out;
  for (int64_t b : kept) out += is_attn[b] ? 'a' : 'f';
  return out;
}

XlConfig derived_config(const XlConfig& search_config, const std::string& layers) {
  XlConfig c = search_config;
  c.model.search = false;
  c.model.search_hard = false;
  c.model.layers = layers;
  validate(c.model);
  return c;
}

}  // namespace spanformer::models::par
