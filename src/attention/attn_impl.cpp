// attn_impl's names and the auto rules (include/spanformer/attention/attn_impl.h says where each
// constant was measured).
#include "spanformer/attention/attn_impl.h"

#include <algorithm>

#include "spanformer/util/names.h"

namespace spanformer::attention {
namespace {

constexpr auto kAttnImplNames = name_table("attn_impl", std::pair{AttnImpl::kAuto, "auto"},
                                           std::pair{AttnImpl::kFused, "fused"},
                                           std::pair{AttnImpl::kPlain, "plain"});

// The banded / sparse paths against the plain composition: at most 3/4 of its query-key pairs.
constexpr double kMaxReadFraction = 0.75;

}  // namespace

const char* attn_impl_name(AttnImpl value) { return kAttnImplNames.name(value); }
AttnImpl parse_attn_impl(const std::string& name) { return kAttnImplNames.parse(name); }

namespace auto_rule {

bool span_fused(bool cuda) { return !cuda; }

bool xl_per_head_windows(int64_t keys, int64_t queries, const std::vector<int64_t>& visited) {
  int64_t read = 0;  // per-head products pay off once they skip a quarter of the keys
  for (int64_t S : visited) read += std::min(keys, S - 1 + queries);
  return 4 * read <= 3 * static_cast<int64_t>(visited.size()) * keys;
}

bool causal_tiles(double read, int64_t heads) { return read <= kMaxReadFraction * static_cast<double>(heads); }

bool sparse_blocks(double blocks, int64_t queries, int64_t keys) {
  return blocks <= kMaxReadFraction * static_cast<double>(queries) * static_cast<double>(keys);
}

bool dense_sdpa(int64_t queries, int64_t keys, bool training, double dropout) {
  return queries == keys && (!training || dropout == 0);
}

bool cpu_flash(bool cuda) { return !cuda; }

bool flash_kernels(bool cuda, bool half, int64_t head_dim, int64_t queries, int64_t keys) {
  return cuda && half && (head_dim == 32 || head_dim == 64 || head_dim == 128) && queries == keys;
}

}  // namespace auto_rule
}  // namespace spanformer::attention
