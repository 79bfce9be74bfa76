#include "spanformer/attention/record.h"

#include "spanformer/util/error.h"

namespace spanformer::attention {
namespace {
thread_local WeightRecorder* current = nullptr;
}  // namespace

WeightRecorder::WeightRecorder() {
  if (current != nullptr) fail("attention weights: a recorder is already active on this thread");
  current = this;
}

WeightRecorder::~WeightRecorder() { current = nullptr; }

WeightRecorder* WeightRecorder::active() { return current; }

void WeightRecorder::add_by_position(const at::Tensor& a_in) {
  auto a = a_in.detach().to(at::kCPU, at::kDouble);  // (B, K, n, c)
  const int64_t n = a.size(2), c = a.size(3);
  // Query i sits at key position p = c - n + i; distance d reads key p - d (zero where p - d < 0).
  auto d = at::arange(c, at::kLong).view({1, c});                 // (1, S + 1), S = c - 1
  auto p = at::arange(c - n, c, at::kLong).view({n, 1});          // (n, 1)
  auto key = p - d;                                               // (n, S + 1)
  auto valid = key.ge(0);
  auto index = key.clamp_min(0).expand({a.size(0), a.size(1), n, c});
  layers.push_back(a.gather(3, index) * valid.to(at::kDouble));  // (B, K, n, S + 1)
}

void WeightRecorder::add_by_window(const at::Tensor& a_in) {
  auto a = a_in.detach().to(at::kCPU, at::kDouble);  // (B, K, n, L')
  auto self = at::zeros({a.size(0), a.size(1), a.size(2), 1}, a.options());
  layers.push_back(at::cat({self, a.flip({3})}, 3));  // (B, K, n, L' + 1): column L' - j -> d
}

}  // namespace spanformer::attention
