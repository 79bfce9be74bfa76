// Work handed out as threads come free, for the CPU kernels: items differ in cost (a head's span, a
// causal tile's number of keys), so a static split of at::parallel_for's range leaves one thread with
// the long items. Each worker takes the next item when done with one; items are best listed costliest
// first, so that the cheap ones fill the last gaps. Every item writes outputs of its own, so a result
// does not depend on which thread took which item.
//
// The workers run with the caller's thread-local state (grad mode, the dispatcher's excluded keys, ...):
// OpenMP's threads start without it, and an ATen op called by a kernel below the autograd layer would
// otherwise see its inputs as requiring grad ("functions with out=... arguments don't support automatic
// differentiation").
#pragma once
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace spanformer::ops::cpu {

// f(j) for j in [0, n) on the intra-op threads.
template <typename F>
void for_each_item(int64_t n, const F& f) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  const at::ThreadLocalState caller;
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    const at::ThreadLocalStateGuard state(caller);
    for (int64_t j = next++; j < n; j = next++) f(j);
  });
}

// The same with a scratch object per worker, made once by make() on that worker's thread (tile
// buffers): f(j, scratch).
template <typename Make, typename F>
void for_each_item(int64_t n, const Make& make, const F& f) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  const at::ThreadLocalState caller;
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    const at::ThreadLocalStateGuard state(caller);
    int64_t j = next++;
    if (j >= n) return;
    auto scratch = make();
    for (; j < n; j = next++) f(j, scratch);
  });
}

}  // namespace spanformer::ops::cpu
