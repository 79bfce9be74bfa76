// Token batches as tensors (data/batches.h).
#include "spanformer/data/batches.h"

#include "spanformer/util/error.h"

namespace spanformer::data {

std::pair<at::Tensor, at::Tensor> make_block(const Streams& streams, int64_t pos, int64_t M, at::Device device,
                                             int64_t first, int64_t count) {
  if (count < 0) count = streams.batch() - first;
  auto x = at::empty({count, M}, at::kLong);
  auto y = at::empty({count, M}, at::kLong);
  streams.block(pos, M, x.data_ptr<int64_t>(), y.data_ptr<int64_t>(), first, count);
  return {x.to(device), y.to(device)};
}

std::pair<at::Tensor, at::Tensor> make_contexts(const TokenFile& tokens, const std::vector<int64_t>& starts,
                                                int64_t T, at::Device device) {
  const auto n = static_cast<int64_t>(starts.size());
  auto x = at::empty({n, T}, at::kLong);  // (n, T)
  auto y = at::empty({n, T}, at::kLong);  // (n, T)
  int64_t* xp = x.data_ptr<int64_t>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < n; ++b) {
    const int64_t s = starts[static_cast<size_t>(b)];
    if (s < 0 || s + T >= tokens.size()) fail("context [{}, {}] lies outside {}", s, s + T, tokens.path());
    for (int64_t t = 0; t < T; ++t) {
      xp[b * T + t] = tokens.at(s + t);
      yp[b * T + t] = tokens.at(s + t + 1);
    }
  }
  return {x.to(device), y.to(device)};
}

}  // namespace spanformer::data
